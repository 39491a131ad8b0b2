/**
 * Keeps the benchmark suite (bench/) from rotting: runs `bench --smoke --json`
 * (seconds, tiny sizes) and checks that every row is there with sensible
 * numbers. Nothing here depends on speed: any positive figure passes.
 */
import { TRANSPORT_NAMES } from '../src/cli/transport-choice.js';
import test from 'ava';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Report, Row } from '../bench/report.js';

const BENCH = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../bench/main.js');

const EXPECTED_ROWS: string[] = [
  ...['direct-tls', 'cp-node', 'node-cp'].flatMap((p) => ['up', 'down'].flatMap((m) => [1, 8].map((f) => `throughput.${p}.${m}.${f}`))),
  ...['direct-tcp', 'direct-tls', 'cp-node', 'cp-node-tls', 'node-cp'].map((p) => `latency.${p}`),
  ...['direct-tcp', 'cp-node', 'node-cp'].map((p) => `loaded.${p}`),
  ...['direct-tcp', 'direct-tls', 'cp-node', 'cp-node-tls', 'node-cp'].flatMap((p) => [`requests.${p}.c1`, `requests.${p}.c16`]),
  'memory.idle-connections',
  'agents.per-agent',
  'isolation.stalled-client',
  'isolation.stalled-backend',
];

/** The figures every row of a section must carry. */
const REQUIRED_VALUES: Record<Row['section'], string[]> = {
  throughput: ['mbps', 'gbps', 'endpointCpuSPerGB'],
  latency: ['p50Ms', 'p99Ms', 'samples'],
  loaded: ['p50Ms', 'p99Ms', 'samples', 'bulkMbps'],
  requests: ['rps', 'requests'],
  memory: ['connections', 'serverKiBPerConn', 'agentKiBPerConn', 'serverRssMiB', 'agentRssMiB'],
  agents: ['agents', 'serverKiBPerAgent', 'agentSideKiBPerAgent', 'serverRssMiB'],
  isolation: ['aloneMbps', 'stalledMbps', 'ratio', 'serverGrowthMiB', 'agentGrowthMiB'],
};

function runBench(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [BENCH, ...args], { maxBuffer: 16 * 1024 * 1024, timeout: 100_000, killSignal: 'SIGINT' }, (err, stdout, stderr) => {
      const code = err ? (typeof err.code === 'number' ? err.code : 1) : 0;
      resolve({ code, stdout, stderr });
    });
  });
}

test('bench --smoke --json reports every row with positive numbers', async (t) => {
  t.timeout(115_000);
  const r = await runBench(['--smoke', '--json']);
  t.is(r.code, 0, `bench exited with ${r.code}:\n${r.stderr.split('\n').slice(-20).join('\n')}`);
  const report = JSON.parse(r.stdout) as Report;
  t.is(report.tool, 'kanal-bench');
  t.is(report.mode, 'smoke');
  t.is(report.transport, TRANSPORT_NAMES[0]);
  t.true(report.machine.nproc > 0 && report.machine.cpuModel.length > 0 && report.machine.node.startsWith('v'));
  const byId = new Map(report.rows.map((row) => [row.id, row]));
  t.deepEqual(EXPECTED_ROWS.filter((id) => !byId.has(id)), [], 'rows missing from the report');
  for (const row of report.rows) {
    for (const key of REQUIRED_VALUES[row.section]) t.true(key in row.values, `${row.id} lacks ${key}`);
    if (row.baseline) t.true('ratio' in row.values || 'ratioP50' in row.values, `${row.id} has a baseline but no ratio`);
    if (row.section === 'throughput' && row.baseline) t.true('proxyCpuSPerGB' in row.values, `${row.id} lacks Kanal CPU`);
    for (const [key, v] of Object.entries(row.values)) {
      t.true(Number.isFinite(v), `${row.id}.${key} = ${v}`);
      // CPU time comes from /proc in 10 ms ticks: a smoke-sized run may see none.
      const mayBeZero = row.signed?.includes(key) || key.endsWith('CpuSPerGB');
      if (mayBeZero) t.true(v >= 0 || row.signed?.includes(key) === true, `${row.id}.${key} = ${v}`);
      else t.true(v > 0, `${row.id}.${key} = ${v} should be positive`);
    }
  }
  t.deepEqual(report.warnings.filter((w) => w.includes('failed:')), [], 'a section failed');
  // It cleaned up after itself.
  const dir = /setting up in (\S+)/.exec(r.stderr)?.[1];
  t.truthy(dir, 'the bench names its temporary directory');
  t.false(existsSync(dir!), `${dir} was left behind`);
});
