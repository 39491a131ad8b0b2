/**
 * Which worker of one cluster takes each connection (workers/cluster-steering.ts),
 * what makes a worker a server of its own (config/cluster-worker.ts), the
 * cgroup's CPU quota behind `--workers 0` (common/cpu-quota.ts), and the
 * configuration's --workers for one cluster.
 */
import test from 'ava';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ClusterSteering } from '../../../src/server/workers/cluster-steering.js';
import { clusterWorkerSettings } from '../../../src/server/config/cluster-worker.js';
import { workerServerID } from '../../../src/server/workers/worker-server.js';
import { coresOfCpuMax, cpuQuota } from '../../../src/common/cpu-quota.js';
import { validateServerArgs, type ServerArgs } from '../../../src/cli/server-command.js';
import { parseServerFlags } from '../../../kit/launch/in-process.js';

test("one node's successive agent connections reach every worker within as many connects, whatever other nodes do", (t) => {
  const s = new ClusterSteering(3);
  const all = [0, 1, 2];
  const a = [s.agent(all, '10.0.0.1'), s.agent(all, '10.0.0.2'), s.agent(all, '10.0.0.1'), s.agent(all, '10.0.0.1')];
  t.deepEqual(new Set([a[0], a[2], a[3]]), new Set(all), `node 1 went to ${a.join(', ')}`);
  t.not(a[0], a[1], 'a new node starts at the next turn, not where the last one did');
});

test('a worker not ready is skipped; none ready: no worker', (t) => {
  const s = new ClusterSteering(2);
  t.is(s.agent([1], 'h'), 1);
  t.is(s.agent([1], 'h'), 1, 'the only ready one, again');
  t.is(s.agent([], 'h'), undefined);
  t.is(s.frontend([]), undefined);
});

test('frontends go in turn to the workers holding the most agents: a worker catching up gets none', (t) => {
  const s = new ClusterSteering(3);
  const all = [0, 1, 2];
  // No agent anywhere: in turn over all (each answers as one process does without agents).
  t.deepEqual(new Set([s.frontend(all), s.frontend(all), s.frontend(all)]), new Set(all));
  s.agentsOf(0, 5);
  s.agentsOf(1, 5);
  s.agentsOf(2, 2);
  const picks = Array.from({ length: 6 }, () => s.frontend(all));
  t.false(picks.includes(2), `picks ${picks.join(', ')}`);
  t.true(picks.includes(0) && picks.includes(1));
  s.gone(0);
  t.true(
    Array.from({ length: 4 }, () => s.frontend([1, 2])).every((w) => w === 1),
    'a worker gone holds nothing',
  );
  t.is(s.agentsHeld(1), 5);
});

test('a worker is its own server: its ID suffixed, the server count multiplied by the workers', (t) => {
  const v = validateServerArgs(parse(['--server-id', 'cp-1', '--server-count', '3', '--workers', '2'])).settings;
  const w = clusterWorkerSettings(v, { index: 1, count: 2 });
  t.is(w['server-id'], 'cp-1-w1');
  t.is(w['server-count'], 6);
  t.is(workerServerID('cp-1', 0), 'cp-1-w0');
  t.is(v['server-id'], 'cp-1', "the command line's settings are not changed");
});

test('cpu.max: a quota rounds up to whole cores, "max" or nonsense is no quota; never more than the cores there are', (t) => {
  t.is(coresOfCpuMax('200000 100000\n'), 2);
  t.is(coresOfCpuMax('150000 100000'), 2);
  t.is(coresOfCpuMax('50000 100000'), 1);
  t.is(coresOfCpuMax('max 100000'), undefined);
  t.is(coresOfCpuMax('garbage'), undefined);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kanal-cpu-max-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const file = path.join(dir, 'cpu.max');
  fs.writeFileSync(file, '300000 100000\n');
  t.is(cpuQuota(file, 16), 3);
  t.is(cpuQuota(file, 2), 2);
  t.is(cpuQuota(path.join(dir, 'absent'), 4), 4, 'no cgroup file: the cores');
});

const ONE_CLUSTER = [
  '--cluster-cert',
  '/x/a.crt',
  '--cluster-key',
  '/x/a.key',
  '--cluster-ca-cert',
  '/x/ca.crt',
  '--uds-name',
  '/tmp/k.sock',
];

function parse(extra: string[]): ServerArgs {
  return parseServerFlags([...ONE_CLUSTER, ...extra]);
}

test('--workers for one cluster: N above 1 is kept, 1 is none, auto and 0 are the CPU quota; anything else is refused naming it', (t) => {
  t.is(validateServerArgs(parse(['--workers', '2'])).workers, 2);
  t.is(validateServerArgs(parse([])).workers, undefined);
  const quota = cpuQuota() > 1 ? cpuQuota() : undefined;
  t.is(validateServerArgs(parse(['--workers', '0'])).workers, quota);
  t.is(validateServerArgs(parse(['--workers', 'auto'])).workers, quota);
  for (const bad of ['two', '-1', '1.5', ''])
    t.throws(
      () => validateServerArgs(parse(['--workers', bad])),
      { message: /--workers must be auto or a whole number of at least 0, got/ },
      bad,
    );
  // The plain listeners are spread too (primary.ts binds them for the workers).
  t.is(validateServerArgs(parse(['--workers', '2', '--socks5-port', '1080', '--http-proxy-port', '8132'])).workers, 2);
});
