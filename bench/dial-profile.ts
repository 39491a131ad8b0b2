/**
 * `npm run build && node dist/bench/dial-profile.js [options]`: where the time
 * and CPU of one dial go (findings: bench/notes/dial-profile.md), Kanal next to upstream.
 *
 * The topology is the bench's (bench/env.ts setUp): a dial is a Unix-socket
 * connect + HTTP CONNECT to the server's frontend, the server's DIAL_REQ
 * through the tunnel, the agent's TCP connect to an echo backend, DIAL_RSP,
 * `200`, one byte written and echoed back, then the client's close and its
 * teardown through the tunnel. Passes, each over `--dials` dials after a
 * warm-up, products interleaved over `--rounds`:
 *
 * - always: latency, CPU (user and system) µs per dial, context switches
 *   and minor page faults per dial of each server and agent (/proc);
 *   `--compare DIR` adds a second Kanal pair run from another checkout's
 *   build (DIR/dist), in the same interleaved rounds: an A/B test of a change;
 *   `--next-to-bulk` measures the dials while one download runs through the
 *   same pair (the bench's "dial next to a bulk download"; the CPU columns
 *   then include the download's);
 * - `--strace`: system calls per dial by name (strace -f -c on each process;
 *   a separate pass, as tracing slows the processes down);
 * - `--timeline FILE`: one dial's system calls in both processes of each
 *   product, merged in time order (strace -f -ttt -T), written to FILE;
 * - `--perf`: CPU time per dial by binary (kernel, node's C++ with OpenSSL,
 *   nghttp2 and libuv, JIT-compiled JavaScript, Go) and by native symbol
 *   (perf record -e cpu-clock on each process; needs perf);
 * - `--cpu-prof`: a fresh Kanal pair under `node --cpu-prof --trace-gc`:
 *   self time per dial by area and by function, and GCs per dial.
 */
import fs from 'node:fs';
import path from 'node:path';
import { spawn, spawnSync } from 'node:child_process';
import { parseArgs } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';
import { cleanUp } from './children.js';
import { aimClient, openFlows, pairOf, products, setUp, waitIdle, withFreshPair, type Env } from './env.js';
import { startPair, type KanalPair } from './cluster.js';
import type { Path, Product } from './loadgen-protocol.js';
import { PARAMS } from './params.js';
import { summariseProfile, type ProfileSummary } from './profile.js';
import { cpuTimes, type CpuTimes } from './proc.js';
import { inRepOrder, percentile } from './stats.js';
import { errorMessage } from '../src/common/error-message.js';
import { LOG_LEVELS } from '../src/common/logger.js';

const USAGE = `usage: node dist/bench/dial-profile.js [--dials N] [--rounds R] [--concurrency C] [--strace] [--timeline FILE] [--cpu-prof] [--upstream DIR|none]
  --dials N        dials per product per round (default 1000)
  --rounds R       interleaved rounds (default 3)
  --warmup N       dials per product before measuring (default 4000: V8 keeps optimising for ~3,000 dials)
  --concurrency C  dials at a time (default 1)
  --strace         also count system calls per dial (strace -f -c)
  --timeline FILE  also trace one dial of each product (strace -f -ttt -T) into FILE
  --perf           also sample both processes with perf (cpu-clock) over the same dials
  --cpu-prof       also profile a fresh Kanal pair (--cpu-prof, --trace-gc) over the same dials
  --v8-trace       with --cpu-prof: also count V8's optimisations and deoptimisations (--trace-opt --trace-deopt)
  --keep DIR       copy the raw .cpuprofile and strace files into DIR
  --compare DIR    also run a Kanal pair from DIR/dist (another checkout, built) in the same rounds
  --compare-log-level LEVEL  the compared pair's --log-level (default info); without --compare, a second
                   pair of this build: warn measures what the info lines (\`connection ended\`) cost
  --next-to-bulk   dial while one download runs through the same pair (its CPU is counted too)
  --upstream       as for npm run bench`;

const PATH_OF: Record<Product, Path> = { kanal: 'kanal-cp', upstream: 'upstream-cp' };

interface Options {
  warmup: number;
  dials: number;
  rounds: number;
  concurrency: number;
  strace: boolean;
  timeline?: string;
  cpuProf: boolean;
  perf: boolean;
  v8Trace: boolean;
  keep?: string;
  compare?: string;
  compareLogLevel?: string;
  nextToBulk: boolean;
  upstream?: string;
}

function parseOptions(): Options {
  const { values } = parseArgs({
    options: {
      dials: { type: 'string', default: '1000' },
      warmup: { type: 'string', default: '4000' },
      rounds: { type: 'string', default: '3' },
      concurrency: { type: 'string', default: '1' },
      strace: { type: 'boolean', default: false },
      timeline: { type: 'string' },
      'cpu-prof': { type: 'boolean', default: false },
      perf: { type: 'boolean', default: false },
      'v8-trace': { type: 'boolean', default: false },
      keep: { type: 'string' },
      compare: { type: 'string' },
      'compare-log-level': { type: 'string' },
      'next-to-bulk': { type: 'boolean', default: false },
      upstream: { type: 'string' },
      help: { type: 'boolean', short: 'h', default: false },
    },
    strict: true,
  });
  if (values.help) {
    process.stdout.write(`${USAGE}\n`);
    process.exit(0);
  }
  const positive = (name: string, v: string): number => {
    const n = Number(v);
    if (!Number.isInteger(n) || n < 1) throw new Error(`--${name} must be a positive integer`);
    return n;
  };
  return {
    dials: positive('dials', values.dials),
    warmup: positive('warmup', values.warmup),
    rounds: positive('rounds', values.rounds),
    concurrency: positive('concurrency', values.concurrency),
    strace: values.strace,
    timeline: values.timeline,
    cpuProf: values['cpu-prof'],
    perf: values.perf,
    v8Trace: values['v8-trace'],
    keep: values.keep,
    compare: values.compare,
    compareLogLevel: values['compare-log-level'],
    nextToBulk: values['next-to-bulk'],
    upstream: values.upstream,
  };
}

/**
 * Runs `n` dials of `product` (next to one download through it with
 * `nextToBulk`), then waits until every connection is torn down (teardown
 * is part of a dial's cost).
 */
async function dials(env: Env, product: Product, n: number, concurrency: number, nextToBulk = false): Promise<number[]> {
  const flow = nextToBulk ? await openFlows(env, PATH_OF[product], 'down', 1) : undefined;
  try {
    if (flow) await sleep(env.params.warmupMs); // the flow is up to speed and its window has grown
    const r = await env.client.call('dials', { path: PATH_OF[product], n, concurrency }, 600_000);
    if (r.errors > 0) env.warnings.push(`${product}: ${r.errors} dial(s) failed, first: ${r.firstError ?? '?'}`);
    return r.latenciesMs;
  } finally {
    await flow?.stop();
    await waitIdle(env);
  }
}

type Role = 'server' | 'agent';
const ROLES: Role[] = ['server', 'agent'];

function pidsOf(env: Env, product: Product): Record<Role, number> {
  const pair = pairOf(env, product);
  return { server: pair.server.pid, agent: pair.agent.pid };
}

interface ProductRuns {
  latencies: number[];
  /** Per role: the CPU times of the measured dials, summed over rounds. */
  cost: Record<Role, CpuTimes>;
  dials: number;
}

const ZERO: CpuTimes = { userS: 0, systemS: 0, voluntarySwitches: 0, involuntarySwitches: 0, minorFaults: 0 };

function add(a: CpuTimes, b: CpuTimes, sign = 1): CpuTimes {
  return {
    userS: a.userS + sign * b.userS,
    systemS: a.systemS + sign * b.systemS,
    voluntarySwitches: a.voluntarySwitches + sign * b.voluntarySwitches,
    involuntarySwitches: a.involuntarySwitches + sign * b.involuntarySwitches,
    minorFaults: a.minorFaults + sign * b.minorFaults,
  };
}

/** A pair measured in the rounds: Kanal's, upstream's, or (with --compare) Kanal's from another build. */
interface Contestant {
  name: string;
  product: Product;
  /** The env whose pair of `product` it is; the client is aimed at it for its batches. */
  env: Env;
}

/** `fn` with the client aimed at `c`'s pairs, and back at the main ones afterwards. */
async function aimedAt<T>(main: Env, c: Contestant, fn: () => Promise<T>): Promise<T> {
  if (c.env === main) return fn();
  await aimClient(c.env);
  try {
    return await fn();
  } finally {
    await aimClient(main);
  }
}

async function measure(env: Env, contestants: Contestant[], o: Options): Promise<Map<string, ProductRuns>> {
  const runs = new Map<string, ProductRuns>(
    contestants.map((c) => [c.name, { latencies: [], cost: { server: ZERO, agent: ZERO }, dials: 0 }]),
  );
  for (const c of contestants) {
    env.progress(`${c.name}: ${o.warmup} warm-up dials`);
    await aimedAt(env, c, () => dials(c.env, c.product, o.warmup, o.concurrency)); // JIT, pools, first-use allocations
  }
  for (let round = 0; round < o.rounds; round++) {
    for (const c of inRepOrder(contestants, round)) {
      env.progress(`${c.name}: ${o.dials} dials, round ${round + 1}/${o.rounds}`);
      const pids = pidsOf(c.env, c.product);
      const before = { server: cpuTimes(pids.server), agent: cpuTimes(pids.agent) };
      const lat = await aimedAt(env, c, () => dials(c.env, c.product, o.dials, o.concurrency, o.nextToBulk));
      const r = runs.get(c.name)!;
      r.latencies.push(...lat);
      r.dials += o.dials;
      for (const role of ROLES) r.cost[role] = add(r.cost[role], add(cpuTimes(pids[role]), before[role], -1));
    }
  }
  return runs;
}

/** Attaches `strace args -p pid`; see attachTool. */
function attachStrace(pid: number, args: string[]): Promise<() => Promise<void>> {
  return attachTool('strace', [...args, '-p', String(pid)]);
}

/** Starts `tool args` (strace or perf attached to a process) and returns a function that stops it (SIGINT) and resolves once it wrote its output. */
async function attachTool(tool: string, args: string[]): Promise<() => Promise<void>> {
  const proc = spawn(tool, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  proc.stderr.on('data', (c: Buffer) => (err += c.toString()));
  const exited = new Promise<void>((resolve) => proc.once('exit', () => resolve()));
  await sleep(500); // attaching to every thread takes a moment
  if (proc.exitCode !== null) throw new Error(`${tool} ${args.join(' ')} exited: ${err.trim()}`);
  return async () => {
    proc.kill('SIGINT');
    const timer = setTimeout(() => proc.kill('SIGKILL'), 10_000);
    await exited;
    clearTimeout(timer);
  };
}

/** `strace -c` summary: calls per system call name. */
function parseStraceSummary(file: string): Map<string, number> {
  const calls = new Map<string, number>();
  for (const line of fs.readFileSync(file, 'utf8').split('\n')) {
    const m = /^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$/.exec(line);
    if (m && m[2] !== 'total') calls.set(m[2], Number(m[1]));
  }
  return calls;
}

async function straceCounts(env: Env, o: Options): Promise<Map<Product, Record<Role, Map<string, number>>>> {
  const out = new Map<Product, Record<Role, Map<string, number>>>();
  for (const p of products(env)) {
    env.progress(`${p}: ${o.dials} dials under strace -c`);
    const pids = pidsOf(env, p);
    const files = { server: path.join(env.dir, `strace-${p}-server.txt`), agent: path.join(env.dir, `strace-${p}-agent.txt`) };
    const stops = await Promise.all(ROLES.map((role) => attachStrace(pids[role], ['-f', '-c', '-qq', '-o', files[role]])));
    await dials(env, p, o.dials, o.concurrency);
    await Promise.all(stops.map((stop) => stop()));
    out.set(p, { server: parseStraceSummary(files.server), agent: parseStraceSummary(files.agent) });
  }
  return out;
}

/** What perf attributed to each binary and symbol: µs per dial, largest first. */
interface PerfBreakdown {
  dsos: [string, number][];
  symbols: [string, number][];
}

/** `perf report` lines "overhead period dso symbol" summed by `key`, as µs per dial (cpu-clock periods are ns). */
function perfReport(file: string, sort: string, n: number): [string, number][] {
  const { status, stdout, stderr } = spawnSync('perf', ['report', '-i', file, '--stdio', '-q', '--sort', sort, '-F', `period,${sort}`], {
    encoding: 'utf8',
    maxBuffer: 64 * 1024 * 1024,
  });
  if (status !== 0) throw new Error(`perf report: ${stderr.trim()}`);
  const out: [string, number][] = [];
  for (const line of stdout.split('\n')) {
    const m = /^\s*(\d+)\s+(.+?)\s*$/.exec(line);
    if (m) out.push([m[2].replace(/\s+/g, ' ').replace(/\[JIT\] tid \d+/, '[JIT]'), Number(m[1]) / 1000 / n]);
  }
  return out.sort((a, b) => b[1] - a[1]);
}

async function perfProfiles(env: Env, o: Options): Promise<Map<string, PerfBreakdown>> {
  const out = new Map<string, PerfBreakdown>();
  for (const p of products(env)) {
    env.progress(`${p}: ${o.dials} dials under perf record`);
    const pids = pidsOf(env, p);
    const files = { server: path.join(env.dir, `perf-${p}-server.data`), agent: path.join(env.dir, `perf-${p}-agent.data`) };
    const stops = await Promise.all(
      ROLES.map((role) =>
        attachTool('perf', ['record', '-e', 'cpu-clock', '-F', '4999', '-q', '-o', files[role], '-p', String(pids[role])]),
      ),
    );
    await dials(env, p, o.dials, o.concurrency);
    await Promise.all(stops.map((stop) => stop()));
    for (const role of ROLES)
      out.set(`${p} ${role}`, { dsos: perfReport(files[role], 'dso', o.dials), symbols: perfReport(files[role], 'dso,sym', o.dials) });
  }
  return out;
}

/** One dial of each product with every system call of both processes, merged in time order. */
async function timeline(env: Env, file: string): Promise<string[]> {
  const lines: string[] = [];
  const summary: string[] = [];
  for (const p of products(env)) {
    env.progress(`${p}: one dial under strace -ttt`);
    const pids = pidsOf(env, p);
    const files = { server: path.join(env.dir, `timeline-${p}-server.txt`), agent: path.join(env.dir, `timeline-${p}-agent.txt`) };
    const stops = await Promise.all(
      ROLES.map((role) => attachStrace(pids[role], ['-f', '-ttt', '-T', '-qq', '-s', '64', '-o', files[role]])),
    );
    await sleep(300);
    const t0 = Date.now() / 1000;
    const [ms] = await dials(env, p, 1, 1);
    await sleep(300);
    await Promise.all(stops.map((stop) => stop()));
    const events: { t: number; text: string }[] = [];
    const counts: string[] = [];
    for (const role of ROLES) {
      let n = 0;
      let wakeups = 0;
      for (const line of fs.readFileSync(files[role], 'utf8').split('\n')) {
        const m = /^(\d+)\s+(\d+\.\d+)\s+(.*)$/.exec(line);
        if (!m) continue;
        const t = Number(m[2]);
        if (t < t0) continue;
        // Idle threads' periodic wake-ups (Go's sysmon, timers) are left out of the picture.
        if (/^(nanosleep|futex|clock_nanosleep)\(/.test(m[3]) && !/resumed/.test(m[3])) continue;
        n++;
        if (/^epoll_(p)?wait\(.*= [1-9]/.test(m[3]) || /<\.\.\. epoll_(p)?wait resumed>.*= [1-9]/.test(m[3])) wakeups++;
        events.push({ t, text: `${p.padEnd(8)} ${role.padEnd(6)} tid ${m[1].padEnd(7)} ${m[3]}` });
      }
      counts.push(`${role} ${n} syscalls (${wakeups} epoll wake-ups with events)`);
    }
    events.sort((a, b) => a.t - b.t);
    const first = events[0]?.t ?? t0;
    lines.push(`# ${p}: one dial, ${ms?.toFixed(3) ?? '?'} ms as the client saw it (strace slows every syscall); ${counts.join(', ')}`);
    for (const e of events) lines.push(`${((e.t - first) * 1e6).toFixed(0).padStart(7)} µs  ${e.text}`);
    lines.push('');
    summary.push(`${p}: ${counts.join(', ')} (idle-thread sleeps left out)`);
  }
  fs.writeFileSync(file, `${lines.join('\n')}\n`);
  return summary;
}

interface Instrumented {
  profiles: ProfileSummary[];
  /** V8 trace events by kind (GCs; optimisations and deoptimisations with --v8-trace). */
  gcs: Record<Role, Record<string, number>>;
  dials: number;
}

/** Counts V8's trace lines by kind (--trace-gc collections, --trace-opt/--trace-deopt events) in the part of `file` after `offset`. */
function v8Events(file: string, offset: number): Record<string, number> {
  const text = fs.readFileSync(file, 'utf8').slice(offset);
  const kinds: Record<string, number> = {};
  const note = (k: string): void => void (kinds[k] = (kinds[k] ?? 0) + 1);
  for (const m of text.matchAll(/\d+ ms: (Scavenge|Mark-Compact|Mark-Sweep|Minor Mark-Sweep)/g)) note(m[1]);
  for (const m of text.matchAll(/\[(compiling method|completed compiling|marking|bailout|deoptimizing|bailout \(kind: [^)]*\))/g))
    note(m[1].replace(/\(kind: ([^,)]*).*/, '($1)'));
  return kinds;
}

async function instrumented(env: Env, o: Options): Promise<Instrumented> {
  const dir = path.join(env.dir, 'profiles');
  fs.mkdirSync(dir);
  const nowUs = (): number => Number(process.hrtime.bigint() / 1000n);
  const window: [number, number] = [0, 0];
  const n = o.dials * o.rounds;
  const result = await withFreshPair(
    env,
    'kanal',
    'profiled',
    async (penv) => {
      const pids = pidsOf(penv, 'kanal');
      await dials(penv, 'kanal', o.warmup, o.concurrency);
      const logs = { server: penv.pair.server.logFile, agent: penv.pair.agent.logFile };
      const offsets = { server: fs.statSync(logs.server).size, agent: fs.statSync(logs.agent).size };
      env.progress(`kanal under --cpu-prof --trace-gc: ${n} dials`);
      window[0] = nowUs();
      await dials(penv, 'kanal', n, o.concurrency);
      window[1] = nowUs();
      fs.writeFileSync(path.join(dir, 'window.json'), JSON.stringify({ fromUs: window[0], toUs: window[1], dials: n, ...pids }));
      return { pids, gcs: { server: v8Events(logs.server, offsets.server), agent: v8Events(logs.agent, offsets.agent) } };
    },
    {
      nodeArgs: [
        '--cpu-prof',
        '--cpu-prof-dir',
        dir,
        '--cpu-prof-interval',
        '100',
        '--trace-gc',
        ...(o.v8Trace ? ['--trace-opt', '--trace-deopt'] : []),
      ],
    },
  );
  const profiles: ProfileSummary[] = [];
  for (const role of ROLES) {
    const f = fs.readdirSync(dir).find((x) => x.includes(`.${result.pids[role]}.`) && x.endsWith('.cpuprofile'));
    if (f) profiles.push(summariseProfile(path.join(dir, f), `kanal ${role}`, `${n} dials`, window, 25));
    else env.warnings.push(`no .cpuprofile from the ${role}`);
  }
  return { profiles, gcs: result.gcs, dials: n };
}

function render(runs: Map<string, ProductRuns>, o: Options): string[] {
  const out: string[] = [];
  const us = (s: number, n: number): string => ((s * 1e6) / n).toFixed(0);
  const per = (x: number, n: number): string => (x / n).toFixed(2);
  out.push(
    `dials ${o.concurrency === 1 ? 'one at a time' : `${o.concurrency} at a time`}${o.nextToBulk ? ' next to one download' : ''}; ${o.rounds} rounds of ${o.dials}, products interleaved`,
  );
  out.push('  product   p50 ms  p99 ms  mean ms | process  user µs  sys µs  total µs  vol cs  invol cs  minflt   (all per dial)');
  for (const [p, r] of runs) {
    const head = `  ${p.padEnd(9)} ${percentile(r.latencies, 50).toFixed(3).padStart(6)}  ${percentile(r.latencies, 99).toFixed(3).padStart(6)}  ${(r.latencies.reduce((a, b) => a + b, 0) / r.latencies.length).toFixed(3).padStart(7)}`;
    for (const [i, role] of ROLES.entries()) {
      const c = r.cost[role];
      out.push(
        `${i === 0 ? head : ''.padEnd(head.length)} | ${role.padEnd(7)}  ${us(c.userS, r.dials).padStart(7)}  ${us(c.systemS, r.dials).padStart(6)}  ${us(c.userS + c.systemS, r.dials).padStart(8)}  ${per(c.voluntarySwitches, r.dials).padStart(6)}  ${per(c.involuntarySwitches, r.dials).padStart(8)}  ${per(c.minorFaults, r.dials).padStart(6)}`,
      );
    }
  }
  return out;
}

function renderStrace(counts: Map<Product, Record<Role, Map<string, number>>>, n: number): string[] {
  const out = ['', `system calls per dial (strace -f -c over ${n} dials; all threads)`];
  for (const [p, byRole] of counts) {
    for (const role of ROLES) {
      const calls = [...byRole[role]].sort((a, b) => b[1] - a[1]);
      const total = calls.reduce((s, [, c]) => s + c, 0);
      out.push(
        `  ${p.padEnd(8)} ${role.padEnd(6)} ${(total / n).toFixed(1).padStart(6)}: ${calls.map(([name, c]) => `${name} ${(c / n).toFixed(1)}`).join(', ')}`,
      );
    }
  }
  return out;
}

function renderPerf(r: Map<string, PerfBreakdown>, n: number): string[] {
  const out = ['', `perf record -e cpu-clock over ${n} dials: µs per dial by binary, then the largest symbols`];
  for (const [who, b] of r) {
    const total = b.dsos.reduce((s, [, us]) => s + us, 0);
    out.push(
      `  ${who}: ${total.toFixed(0)} µs: ${b.dsos
        .slice(0, 6)
        .map(([d, us]) => `${d} ${us.toFixed(0)}`)
        .join(', ')}`,
    );
    for (const [sym, us] of b.symbols.slice(0, 14)) out.push(`    ${us.toFixed(1).padStart(6)}  ${sym}`);
  }
  return out;
}

function renderInstrumented(r: Instrumented): string[] {
  const out = ['', `Kanal under --cpu-prof (100 µs sampling) and --trace-gc, ${r.dials} dials`];
  for (const role of ROLES) {
    const kinds = Object.entries(r.gcs[role]);
    out.push(
      `  ${role} V8 events per 1,000 dials: ${kinds.length === 0 ? 'none' : kinds.map(([k, c]) => `${k} ${((c * 1000) / r.dials).toFixed(1)}`).join(', ')}`,
    );
  }
  for (const p of r.profiles) {
    const busyUsPerDial = (p.totalMs * (1 - p.idleShare) * 1000) / r.dials;
    out.push(
      '',
      `  ${p.process}: ${busyUsPerDial.toFixed(0)} µs of JS-visible busy time per dial (${(p.idleShare * 100).toFixed(0)}% idle); by area, µs per dial:`,
    );
    out.push(`    ${p.areas.map((a) => `${a.name} ${(a.share * busyUsPerDial).toFixed(1)}`).join(', ')}`);
    for (const f of p.top) out.push(`    ${((f.selfMs * 1000) / r.dials).toFixed(1).padStart(6)} µs  ${f.name}`);
  }
  return out;
}

/** Copies the profiles and strace outputs of the run out of its temp dir (removed on exit). */
function keepRawFiles(dir: string, into: string): void {
  fs.mkdirSync(into, { recursive: true });
  const profiles = path.join(dir, 'profiles');
  const files = fs
    .readdirSync(dir)
    .filter((f) => /^(strace|timeline|perf)-|^profiled-.*\.log$/.test(f))
    .map((f) => path.join(dir, f));
  if (fs.existsSync(profiles)) files.push(...fs.readdirSync(profiles).map((f) => path.join(profiles, f)));
  for (const f of files) fs.copyFileSync(f, path.join(into, path.basename(f)));
}

async function main(): Promise<void> {
  let o: Options;
  try {
    o = parseOptions();
  } catch (err) {
    process.stderr.write(`dial-profile: ${errorMessage(err)}\n${USAGE}\n`);
    process.exitCode = 2;
    return;
  }
  const warnings: string[] = [];
  const progress = (t: string): void => void process.stderr.write(`${t}\n`);
  const out: string[] = [];
  try {
    const env = await setUp({ transport: 'h2', params: { ...PARAMS.quick }, audit: false, upstreamOption: o.upstream, warnings, progress });
    out.push(env.upstreamBinaries ? `upstream: ${env.upstreamBinaries.origin}` : `upstream: ${env.upstreamAbsent}`);
    const contestants: Contestant[] = products(env).map((p) => ({ name: p, product: p, env }));
    let compared: KanalPair | undefined;
    if (o.compare || o.compareLogLevel) {
      const cli = o.compare ? path.resolve(o.compare, 'dist/src/cli/main.js') : undefined;
      if (cli && !fs.existsSync(cli)) throw new Error(`--compare ${o.compare}: no ${cli} (build that checkout first)`);
      const logLevel = o.compareLogLevel ?? 'info';
      if (!LOG_LEVELS.some((l) => l === logLevel)) throw new Error(`--compare-log-level: one of ${LOG_LEVELS.join(', ')}`);
      env.progress(`starting a second Kanal pair from ${cli ?? 'this build'} at --log-level ${logLevel}`);
      compared = await startPair({
        dir: env.dir,
        tag: 'compare',
        pki: env.pki,
        transport: 'h2',
        backend: env.ports,
        cli,
        logLevel,
      });
      contestants.splice(1, 0, { name: 'kanal-B', product: 'kanal', env: { ...env, pair: compared } });
      out.push(`kanal-B: ${cli ?? 'this build'}, --log-level ${logLevel}`);
    }
    out.push(...render(await measure(env, contestants, o), o));
    await compared?.stop();
    if (o.strace) out.push(...renderStrace(await straceCounts(env, o), o.dials));
    if (o.timeline) out.push('', `one dial's system calls: ${o.timeline}`, ...(await timeline(env, o.timeline)).map((l) => `  ${l}`));
    if (o.perf) out.push(...renderPerf(await perfProfiles(env, o), o.dials));
    if (o.cpuProf) out.push(...renderInstrumented(await instrumented(env, o)));
    await env.upstream?.stop();
    await env.pair.stop();
    if (o.keep) keepRawFiles(env.dir, o.keep);
  } finally {
    await cleanUp();
  }
  if (warnings.length > 0) out.push('', 'Warnings:', ...warnings.map((w) => `  - ${w}`));
  process.stdout.write(`${out.join('\n')}\n`);
}

main().catch(async (err: Error) => {
  process.stderr.write(`dial-profile failed: ${err.stack ?? err.message}\n`);
  await cleanUp(1000);
  process.exitCode = 1;
});
