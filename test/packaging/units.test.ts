// systemd units: `systemd-analyze verify` must accept every unit and drop-in
// without a single complaint, the units must say what the deployment model
// needs (before the kubelet, restart, notify, hardening), and every command
// line they run must be accepted by the CLI.

import test from 'ava';
import { mkdir, readFile, readdir, writeFile, chmod } from 'node:fs/promises';
import path from 'node:path';
import { agentSettings } from '../../src/agent/settings.js';
import { parseAgentFlags } from '../../src/cli/install/agent-flags.js';
import { unitDropIn, RESTART_BACKOFF_SYSTEMD } from '../../src/cli/install/node-plan.js';
import { parseDuration } from '../../src/common/duration.js';
import {
  REPO,
  dryRunRefusal,
  expandExecStart,
  kanal,
  parseEnvFile,
  parseUnit,
  run,
  seconds,
  tempDir,
  unitValue,
  type UnitFile,
} from '../helpers/packaging.js';

const SYSTEMD = path.join(REPO, 'systemd');
const DEPLOY = path.join(REPO, 'deploy');
const KANAL_BINARY = '/usr/local/bin/kanal';

const units = (await readdir(SYSTEMD)).filter((f) => f.endsWith('.service'));
const hostSystemd = Number(/^systemd (\d+)/m.exec((await run('systemctl', ['--version'])).stdout)?.[1] ?? '0');

async function loadUnit(name: string): Promise<{ text: string; unit: UnitFile }> {
  const text = await readFile(path.join(SYSTEMD, name), 'utf8');
  return { text, unit: parseUnit(text) };
}

/**
 * A unit directory for `systemd-analyze verify`: the given files, with
 * ExecStart's /usr/local/bin/kanal pointed at an executable stub (verify
 * checks that the binary exists), searched before the system's units.
 */
async function verifyDir(
  files: Record<string, string>,
): Promise<{ dir: string; verify: (...units: string[]) => Promise<{ code: number | null; output: string }>; remove: () => Promise<void> }> {
  const tmp = await tempDir('kanal-units-');
  const stub = path.join(tmp.dir, 'bin', 'kanal');
  await mkdir(path.dirname(stub));
  await writeFile(stub, '#!/bin/sh\nexit 0\n');
  await chmod(stub, 0o755);
  const unitDir = path.join(tmp.dir, 'units');
  for (const [name, text] of Object.entries(files)) {
    await mkdir(path.dirname(path.join(unitDir, name)), { recursive: true });
    await writeFile(path.join(unitDir, name), text.split(KANAL_BINARY).join(stub));
  }
  return {
    dir: unitDir,
    remove: tmp.remove,
    verify: async (...names) => {
      const r = await run('systemd-analyze', ['verify', '--man=no', ...names.map((n) => (n.includes('/') ? path.join(unitDir, n) : n))], {
        env: { ...process.env, SYSTEMD_UNIT_PATH: `${unitDir}:`, SYSTEMD_LOG_COLOR: '0' },
        timeoutMs: 30_000,
      });
      return { code: r.code, output: `${r.stdout}${r.stderr}`.trim() };
    },
  };
}

test("systemd-analyze is installed (scripts/setup.sh installs Debian's systemd package)", async (t) => {
  const r = await run('systemd-analyze', ['--version']);
  t.is(r.code, 0, r.stderr);
  t.regex(r.stdout, /^systemd \d+/);
});

test('the units exist: kanal-agent.service, kanal-server.service and the kubelet drop-in', async (t) => {
  t.deepEqual(units.sort(), ['kanal-agent.service', 'kanal-server.service']);
  t.truthy(await readFile(path.join(SYSTEMD, 'kubelet.service.d', '10-kanal.conf'), 'utf8'));
});

for (const name of units) {
  test(`systemd-analyze verify accepts ${name} without any complaint`, async (t) => {
    const { text } = await loadUnit(name);
    t.true(text.includes(KANAL_BINARY), 'ExecStart runs /usr/local/bin/kanal');
    const v = await verifyDir({ [name]: text });
    t.teardown(v.remove);
    const r = await v.verify(`./${name}`);
    t.is(r.output, '', 'no warnings or errors');
    t.is(r.code, 0);
  });
}

test('systemd-analyze verify is a real check: it reports a bad key and a missing binary', async (t) => {
  const { text } = await loadUnit('kanal-agent.service');
  const v = await verifyDir({
    'kanal-agent.service': text.replace('[Service]', '[Service]\nRestartt=always').replace(KANAL_BINARY, '/nonexistent/kanal'),
  });
  t.teardown(v.remove);
  const r = await v.verify('./kanal-agent.service');
  t.regex(r.output, /Unknown key name 'Restartt'|Unknown key 'Restartt'/);
  t.regex(r.output, /\/nonexistent\/kanal/);
});

test('the kubelet drop-in makes the kubelet want and wait for the agent, and verifies', async (t) => {
  const dropIn = await readFile(path.join(SYSTEMD, 'kubelet.service.d', '10-kanal.conf'), 'utf8');
  const parsed = parseUnit(dropIn);
  t.is(unitValue(parsed, 'Unit', 'Wants'), 'kanal-agent.service');
  t.is(unitValue(parsed, 'Unit', 'After'), 'kanal-agent.service');
  const { text } = await loadUnit('kanal-agent.service');
  const v = await verifyDir({
    'kubelet.service': '[Unit]\nDescription=stand-in kubelet\n[Service]\nExecStart=/bin/true\n',
    'kubelet.service.d/10-kanal.conf': dropIn,
    'kanal-agent.service': text,
  });
  t.teardown(v.remove);
  const r = await v.verify('kubelet.service', 'kanal-agent.service');
  t.is(r.output, '');
  t.is(r.code, 0);
  // The drop-in really is read: a typo in it is reported.
  const bad = await verifyDir({
    'kubelet.service': '[Service]\nExecStart=/bin/true\n',
    'kubelet.service.d/10-kanal.conf': `${dropIn}Wantz=x\n`,
    'kanal-agent.service': text,
  });
  t.teardown(bad.remove);
  t.regex((await bad.verify('kubelet.service')).output, /Wantz/);
});

test('kanal-agent.service: ordering, restart, notify, env file, credentials, hardening', async (t) => {
  const { unit } = await loadUnit('kanal-agent.service');
  const u = (key: string): string | undefined => unitValue(unit, 'Unit', key);
  const s = (key: string): string | undefined => unitValue(unit, 'Service', key);
  t.is(u('After'), 'network-online.target');
  t.is(u('Wants'), 'network-online.target');
  t.is(u('Before'), 'kubelet.service');
  t.is(u('StartLimitIntervalSec'), '0', 'never stops restarting');
  t.is(s('Type'), 'notify');
  t.is(s('NotifyAccess'), 'main');
  t.is(s('Restart'), 'always');
  t.true(seconds(s('RestartSec')!) > 0);
  t.is(s('EnvironmentFile'), '/etc/kanal/agent.env');
  t.is(s('ExecStart'), '/usr/local/bin/kanal agent $KANAL_AGENT_FLAGS');
  t.truthy(s('WatchdogSec'));
  // Stop timeout covers the default drain period.
  const grace = parseDuration(agentSettings['shutdown-grace-period'].default ?? '') / 1000;
  t.true(seconds(s('TimeoutStopSec')!) > grace, `TimeoutStopSec ${s('TimeoutStopSec')} > --shutdown-grace-period ${grace}s`);
  // Least privilege.
  t.is(s('CapabilityBoundingSet'), 'CAP_NET_ADMIN');
  t.is(s('AmbientCapabilities'), 'CAP_NET_ADMIN');
  t.is(s('RestrictAddressFamilies'), 'AF_UNIX AF_INET AF_INET6 AF_NETLINK');
  for (const [key, value] of Object.entries({
    NoNewPrivileges: 'yes',
    ProtectSystem: 'strict',
    ProtectHome: 'yes',
    PrivateTmp: 'yes',
    PrivateDevices: 'yes',
    ProtectKernelModules: 'yes',
    RestrictNamespaces: 'yes',
    SystemCallFilter: '@system-service',
  })) {
    t.is(s(key), value, key);
  }
  t.is(s('ReadWritePaths'), undefined, 'nothing writable');
  t.is(s('MemoryDenyWriteExecute'), undefined, 'V8 needs W+X pages');
  t.is(unitValue(unit, 'Install', 'WantedBy'), 'multi-user.target');
});

test('kanal-server.service: notify, restart, no capabilities, only its runtime directory writable', async (t) => {
  const { unit } = await loadUnit('kanal-server.service');
  const s = (key: string): string | undefined => unitValue(unit, 'Service', key);
  t.is(s('Type'), 'notify');
  t.is(s('Restart'), 'always');
  t.is(s('EnvironmentFile'), '/etc/kanal/server.env');
  t.is(s('ExecStart'), '/usr/local/bin/kanal server $KANAL_SERVER_FLAGS');
  t.is(s('CapabilityBoundingSet'), '');
  t.is(s('ProtectSystem'), 'strict');
  t.is(s('RuntimeDirectory'), 'kanal-server');
  t.is(s('ReadWritePaths'), undefined);
  t.is(unitValue(unit, 'Unit', 'Before'), 'kube-apiserver.service');
});

/** Each unit's ExecStart, with $VARS from each example env file that belongs to it. */
const COMMAND_LINES: { unit: string; envFiles: string[] }[] = [
  { unit: 'kanal-agent.service', envFiles: ['agent.env.example'] },
  { unit: 'kanal-server.service', envFiles: ['server.env.example', 'server-tcp.env.example'] },
];

for (const { unit: name, envFiles } of COMMAND_LINES) {
  for (const envName of envFiles) {
    test(`${name} ExecStart with deploy/${envName} is accepted by the CLI`, async (t) => {
      const { unit } = await loadUnit(name);
      const envFile = unitValue(unit, 'Service', 'EnvironmentFile')!;
      t.is(
        path.basename(envFile),
        envName.replace(/^server-tcp/, 'server').replace(/\.example$/, ''),
        'example matches the EnvironmentFile name',
      );
      const env = parseEnvFile(await readFile(path.join(DEPLOY, envName), 'utf8'));
      const words = expandExecStart(unitValue(unit, 'Service', 'ExecStart')!, env);
      t.is(words[0], KANAL_BINARY);
      const r = await kanal([...words.slice(1), '--dry-run']);
      t.is(dryRunRefusal(r), undefined, `kanal ${words.slice(1).join(' ')} --dry-run`);
      t.truthy(JSON.parse(r.stdout));
    });
  }
}

test('the CLI check is real: an env file with a bad flag is refused', async (t) => {
  const { unit } = await loadUnit('kanal-agent.service');
  const words = expandExecStart(
    unitValue(unit, 'Service', 'ExecStart')!,
    new Map([['KANAL_AGENT_FLAGS', '--proxy-server-host cp --ca-cert /x --target 6443:a:1']]),
  );
  const r = await kanal([...words.slice(1), '--dry-run']);
  t.is(r.code, 2);
  t.regex(r.stderr, /--target needs --bind-address/);
});

test(`install-node's generated drop-in verifies cleanly with the unit (systemd ${hostSystemd})`, async (t) => {
  const env = parseEnvFile(await readFile(path.join(DEPLOY, 'agent.env.example'), 'utf8'));
  const flags = parseAgentFlags(env.get('KANAL_AGENT_FLAGS')!.split(' '));
  const { text } = await loadUnit('kanal-agent.service');
  const lowPort = parseAgentFlags([...flags.words, '--target', '443:127.0.0.1:6443']);
  for (const f of [flags, lowPort]) {
    const v = await verifyDir({
      'kanal-agent.service': text,
      'kanal-agent.service.d/50-install.conf': unitDropIn(f, Math.min(hostSystemd, RESTART_BACKOFF_SYSTEMD - 1)),
    });
    t.teardown(v.remove);
    const r = await v.verify('kanal-agent.service');
    t.is(r.output, '');
    t.is(r.code, 0);
  }
});

test('the restart back-off keys are written only for systemd >= 254, and are the only thing older systemd does not know', async (t) => {
  const env = parseEnvFile(await readFile(path.join(DEPLOY, 'agent.env.example'), 'utf8'));
  const flags = parseAgentFlags(env.get('KANAL_AGENT_FLAGS')!.split(' '));
  const old = unitDropIn(flags, 252);
  t.false(/^RestartSteps=/m.test(old));
  const recent = parseUnit(unitDropIn(flags, 255));
  t.is(unitValue(recent, 'Service', 'RestartSteps'), '10');
  t.is(unitValue(recent, 'Service', 'RestartMaxDelaySec'), '60s');
  const { text } = await loadUnit('kanal-agent.service');
  const v = await verifyDir({ 'kanal-agent.service': text, 'kanal-agent.service.d/50-install.conf': unitDropIn(flags, 255) });
  t.teardown(v.remove);
  const r = await v.verify('kanal-agent.service');
  t.is(r.code, 0);
  if (hostSystemd >= RESTART_BACKOFF_SYSTEMD) {
    t.is(r.output, '');
  } else {
    const complaints = r.output.split('\n').filter((l) => l.trim() !== '');
    t.is(complaints.length, 2, r.output);
    for (const line of complaints)
      t.regex(line, /Unknown key (name )?'(RestartSteps|RestartMaxDelaySec)' in section \[Service\], ignoring/);
  }
});

test('the generated drop-in follows the flags: stop timeout, capabilities', (t) => {
  const base = ['--proxy-server-host', 'cp', '--ca-cert', '/etc/kanal/ca.crt'];
  const cpOnly = parseUnit(unitDropIn(parseAgentFlags([...base, '--shutdown-grace-period', '2m']), 252));
  t.is(unitValue(cpOnly, 'Service', 'TimeoutStopSec'), '135s');
  t.is(unitValue(cpOnly, 'Service', 'CapabilityBoundingSet'), '', 'no capabilities without the node direction');
  const node = parseUnit(unitDropIn(parseAgentFlags([...base, '--bind-address', '10.200.0.1', '--target', '6443:127.0.0.1:6443']), 252));
  t.is(unitValue(node, 'Service', 'CapabilityBoundingSet'), 'CAP_NET_ADMIN');
  const existing = parseUnit(
    unitDropIn(
      parseAgentFlags([...base, '--bind-address', '10.200.0.1', '--target', '443:127.0.0.1:6443', '--bind-interface-type', 'none']),
      252,
    ),
  );
  t.is(unitValue(existing, 'Service', 'CapabilityBoundingSet'), 'CAP_NET_BIND_SERVICE');
  t.is(unitValue(existing, 'Service', 'AmbientCapabilities'), 'CAP_NET_BIND_SERVICE');
});

test('deploy/*.env.example files are what the units read: one variable, plain words', async (t) => {
  for (const name of ['agent.env.example', 'server.env.example', 'server-tcp.env.example']) {
    const env = parseEnvFile(await readFile(path.join(DEPLOY, name), 'utf8'));
    t.is(env.size, 1, name);
    const [value] = [...env.values()];
    t.notRegex(value, /["'\\$`]/, name);
  }
});
