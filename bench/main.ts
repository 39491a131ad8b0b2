/**
 * `npm run bench [-- --full | --smoke] [--json] [--transport NAME] [--only LIST] [--profile] [--upstream DIR|none] [--kanal-cli FILE] [--soak-count N]`
 *
 * Starts a Kanal server and agent (the real CLI, throwaway PKI), upstream
 * Konnectivity's proxy-server and proxy-agent when their binaries are there,
 * a backend and a load generator (separate worker processes), and measures
 * Kanal against upstream and against the same endpoints without a proxy, in
 * the same run: bulk throughput, dial latency (idle and next to a bulk flow),
 * short requests, memory, isolation; and, asked for (--only soak, --full), a
 * connection churn soak. Prints one report (or JSON with --json).
 * Every child process and temp dir is removed on the way out, also on failure and SIGINT.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { isTransportName, TRANSPORT_NAMES } from '../src/transport/choice.js';
import { cleanUp } from './children.js';
import { upstreamOptionProblem } from './upstream.js';
import { sideBySide } from './side-by-side.js';
import { setTimeout as sleep } from 'node:timers/promises';
import { measureReceive, openFlows, setUp, waitIdle, withFreshPair, type Env } from './env.js';
import { PARAMS, type Mode, type Params } from './params.js';
import { machineBusySeconds, machineInfo, selfAndReapedChildrenCpuSeconds } from './proc.js';
import {
  renderText,
  SECTION_ORDER,
  type ReconnectReport,
  type Report,
  type Row,
  type DoorsReport,
  type Section,
  type SoakReport,
  type TenantsReport,
} from './report.js';
import { summariseProfile, type ProfileSummary } from './profile.js';
import { runThroughput } from './suite-throughput.js';
import { runTransport } from './suite-transport.js';
import { runLatency, runLoadedLatency, runRequests } from './suite-dials.js';
import { runAgents, runIdleConnections } from './suite-memory.js';
import { runIsolation } from './suite-isolation.js';
import { runSoak } from './suite-soak.js';
import { runStart } from './suite-start.js';
import { runTenants, TENANTS_PARTS, type TenantsPart } from './suite-tenants.js';
import { runReconnect } from './suite-reconnect.js';
import { runScrape } from './suite-scrape.js';
import { runSocks } from './suite-socks.js';
import { errorMessage } from '../src/common/error-message.js';

const USAGE = `usage: npm run bench -- [--full | --smoke] [--json] [--transport NAME] [--only SECTIONS] [--profile[=up|down]] [--reps N] [--upstream DIR|none]
                            [--kanal-cli FILE] [--audit] [--kanal-workers N] [--soak-count N]
  (default)      quick mode, a few minutes (every section but soak)
  --full         longer runs, 10,000 idle connections, 1,000 agents, and the soak
  --smoke        seconds, tiny sizes: checks that every measurement still works
  --json         print the results as JSON instead of the table
  --transport    gRPC implementation for server, agent and bench agents (default h2)
  --only         comma-separated: ${SECTION_ORDER.join(',')},tenants,hostile,tenant-workers,reconnect,scrape,socks,soak
                 (tenants: one server of many tenants, memory per tenant, reloads, fairness between two tenants, tenants over
                  workers, a hostile agent; hostile: that last part of tenants alone; tenant-workers: its workers parts alone
                  (tenants spread over --workers 1 and 2; one tenant of tenant-workers: 1 and 2);
                  reconnect: HA convergence behind a balancer, connections across a tunnel cut; only when named or --full;
                  scrape: a Prometheus-like load through the forward proxy, CONNECT and upstream's CONNECT; only when named or --full;
                  socks: dials and one bulk flow through SOCKS5 next to CONNECT; only when named or --full;
                  soak: connection churn, 100,000 connections per phase and product, 10-20 minutes; only when named or --full)
  --kanal-cli    the kanal CLI every Kanal pair runs: another build's dist/src/cli/main.js (a before/after run),
                 or a kanal executable (npm run package: dist/release/kanal)
  --audit        the Kanal pairs of the side-by-side sections write audit logs (server and agent, files in the
                 bench's temp dir): run with and without to see what auditing costs
  --kanal-workers N  the Kanal servers run --workers N (one cluster on N cores, docs/multi-tenant.md); their CPU
                 and RSS count the primary and every worker
  --soak-count   connections per soak phase and product (default 100,000; --smoke 2,000)
  --profile      also run the server and agent under --cpu-prof for one CP->node 1-flow case
                 (upload unless =down) and summarise their top self-time functions
  --reps N       override the number of interleaved repetitions
  --upstream     directory holding upstream Konnectivity's proxy-server and proxy-agent, or none;
                 default: KANAL_UPSTREAM_DIR, else ../shared/upstream/ beside the checkout`;

/** Run order: the long-lived pair first, memory and the separate agents server last. */
const RUN_ORDER: Section[] = ['throughput', 'transport', 'latency', 'loaded', 'requests', 'isolation', 'memory', 'agents', 'start'];

interface Options {
  mode: Mode;
  json: boolean;
  transport: string;
  sections: Section[];
  /** The churn soak: long, so only when named (--only soak) or --full. */
  soak: boolean;
  /** Section 7, tenants (suite-tenants.ts): its own tables, like the soak's; run unless --only leaves it out. */
  tenants: boolean;
  /** `--only hostile` or `--only tenant-workers` without tenants: those parts of section 7 alone (undefined: every part). */
  tenantParts?: readonly TenantsPart[];
  /** Section 8, reconnects (suite-reconnect.ts): minutes of waiting on reconnects, so only when named (--only reconnect) or --full. */
  reconnect: boolean;
  /** Section 9, front doors (suite-scrape.ts, suite-socks.ts): only when named (--only scrape,socks) or --full. */
  scrape: boolean;
  socks: boolean;
  kanalCli?: string;
  /** --audit: the Kanal pairs of sections 0-4 write audit logs (the cost of auditing, against a run without). */
  audit: boolean;
  /** --kanal-workers N: the Kanal servers run `--workers N` (a server of one cluster on N cores). */
  kanalWorkers?: number;
  profile?: 'up' | 'down';
  /** --upstream: a directory, "none", or undefined (look in the usual places). */
  upstream?: string;
  params: Params;
}

function parseOptions(argv: string[]): Options {
  const { values } = parseArgs({
    args: argv,
    options: {
      full: { type: 'boolean', default: false },
      smoke: { type: 'boolean', default: false },
      quick: { type: 'boolean', default: false },
      json: { type: 'boolean', default: false },
      transport: { type: 'string', default: 'h2' },
      only: { type: 'string' },
      profile: { type: 'string' },
      reps: { type: 'string' },
      upstream: { type: 'string' },
      'kanal-cli': { type: 'string' },
      audit: { type: 'boolean', default: false },
      'kanal-workers': { type: 'string' },
      'soak-count': { type: 'string' },
      help: { type: 'boolean', short: 'h', default: false },
    },
    strict: true,
    allowPositionals: false,
  });
  if (values.help) {
    process.stdout.write(`${USAGE}\n`);
    process.exit(0);
  }
  if (values.full && values.smoke) throw new Error('--full and --smoke exclude each other');
  const mode: Mode = values.full ? 'full' : values.smoke ? 'smoke' : 'quick';
  const named = values.only?.split(',').map((s) => s.trim());
  const ownTables = ['soak', 'tenants', 'hostile', 'tenant-workers', 'reconnect', 'scrape', 'socks'];
  const unknown = named?.find((s) => !ownTables.includes(s) && !SECTION_ORDER.some((known) => known === s));
  if (unknown !== undefined)
    throw new Error(
      `--only: unknown section ${unknown} (known: ${SECTION_ORDER.join(', ')}, tenants, hostile, tenant-workers, reconnect, scrape, socks, soak)`,
    );
  const sections = named ? SECTION_ORDER.filter((s) => named.includes(s)) : SECTION_ORDER;
  const params = { ...PARAMS[mode] };
  if (values['soak-count'] !== undefined) {
    const n = Number(values['soak-count']);
    if (!Number.isInteger(n) || n < 1) throw new Error('--soak-count must be a positive integer');
    params.soakConnections = n;
  }
  const kanalCli = values['kanal-cli'] === undefined ? undefined : path.resolve(values['kanal-cli']);
  if (kanalCli !== undefined && !fs.existsSync(kanalCli))
    throw new Error(`--kanal-cli ${kanalCli}: no such file (build that tree first: npx tsc -p .)`);
  if (values.reps !== undefined) {
    const reps = Number(values.reps);
    if (!Number.isInteger(reps) || reps < 1) throw new Error('--reps must be a positive integer');
    params.reps = reps;
  }
  let profile: Options['profile'];
  if (values.profile !== undefined) {
    if (values.profile !== '' && values.profile !== 'up' && values.profile !== 'down') throw new Error('--profile takes up or down');
    profile = values.profile === 'down' ? 'down' : 'up';
  }
  const upstreamProblem = values.upstream === undefined ? undefined : upstreamOptionProblem(values.upstream);
  if (upstreamProblem) throw new Error(upstreamProblem);
  if (!isTransportName(values.transport)) {
    throw new Error(`--transport ${values.transport}: the kanal CLI knows ${TRANSPORT_NAMES.join(', ')} (src/transport/choice.ts)`);
  }
  return {
    mode,
    json: values.json,
    transport: values.transport,
    sections: RUN_ORDER.filter((s) => sections.includes(s)),
    soak: named ? named.includes('soak') : mode === 'full',
    tenants: named ? ['tenants', 'hostile', 'tenant-workers'].some((n) => named.includes(n)) : true,
    ...(named && !named.includes('tenants') ? { tenantParts: namedTenantParts(named) } : {}),
    reconnect: named ? named.includes('reconnect') : mode === 'full',
    scrape: named ? named.includes('scrape') : mode === 'full',
    socks: named ? named.includes('socks') : mode === 'full',
    kanalCli,
    audit: values.audit,
    ...kanalWorkersOf(values['kanal-workers']),
    profile,
    upstream: values.upstream,
    params,
  };
}

/** `--profile` alone is parsed by parseArgs as needing a value; accept it bare. */
/** The parts of section 7 that `--only` names without naming all of it. */
function namedTenantParts(named: readonly string[]): TenantsPart[] {
  return TENANTS_PARTS.filter((x) =>
    x === 'hostile' ? named.includes('hostile') : (x === 'workers' || x === 'shared') && named.includes('tenant-workers'),
  );
}

/** --kanal-workers: a whole number from 0 (the server's own default, the CPU quota) up. */
function kanalWorkersOf(value: string | undefined): { kanalWorkers?: number } {
  if (value === undefined) return {};
  const n = Number(value);
  if (!Number.isInteger(n) || n < 0) throw new Error(`--kanal-workers ${value}: a whole number (0: the server's CPU quota)`);
  return { kanalWorkers: n };
}

function normaliseArgv(argv: string[]): string[] {
  return argv.map((a, i) => (a === '--profile' && (argv[i + 1] === undefined || argv[i + 1].startsWith('--')) ? '--profile=' : a));
}

function progressPrinter(): (text: string) => void {
  const tty = process.stderr.isTTY;
  const t0 = Date.now();
  return (text: string) => {
    const line = `[${((Date.now() - t0) / 1000).toFixed(0).padStart(3)} s] ${text}`;
    if (tty) process.stderr.write(`\r\x1b[K${line}`);
    else process.stderr.write(`${line}\n`);
  };
}

async function profileRun(env: Env, mode: 'up' | 'down'): Promise<ProfileSummary[]> {
  const profDir = path.join(env.dir, 'profiles');
  fs.mkdirSync(profDir);
  const scenario = `CP->node ${mode === 'up' ? 'upload' : 'download'}, 1 flow, ${(env.params.profileMs / 1000).toFixed(0)} s`;
  const window: [number, number] = [0, 0];
  const nowUs = (): number => Number(process.hrtime.bigint() / 1000n);
  const pids = await withFreshPair(
    env,
    'kanal',
    'profiled',
    async (penv) => {
      penv.params = { ...env.params, reps: 1, warmupMs: 500, measureMs: env.params.profileMs };
      env.progress(`profile: ${scenario} under --cpu-prof`);
      const run = await openFlows(penv, 'kanal-cp', mode, 1);
      try {
        await measureReceive(penv, 'kanal-cp', mode === 'up', async () => {
          window[0] = nowUs();
          await sleep(penv.params.measureMs);
          window[1] = nowUs();
        });
      } finally {
        await run.stop();
        await waitIdle(penv);
      }
      return { server: penv.pair.server.pid, agent: penv.pair.agent.pid };
    },
    { nodeArgs: ['--cpu-prof', '--cpu-prof-dir', profDir] },
  ); // the pair is stopped with SIGTERM: a clean exit writes the profiles
  const out: ProfileSummary[] = [];
  for (const [name, pid] of Object.entries(pids)) {
    const file = fs.readdirSync(profDir).find((f) => f.includes(`.${pid}.`) && f.endsWith('.cpuprofile'));
    if (!file) {
      env.warnings.push(`profile: no .cpuprofile written by the ${name} (pid ${pid})`);
      continue;
    }
    out.push(summariseProfile(path.join(profDir, file), `kanal ${name}`, scenario, window));
  }
  return out;
}

/**
 * A figure that could not be measured (a ratio to zero, CPU of a run too short
 * for /proc's 10 ms ticks) is left out rather than reported as NaN or null.
 */
function withoutNonFinite<R extends Pick<Row, 'values'>>(rows: R[]): R[] {
  return rows.map((row) => ({ ...row, values: Object.fromEntries(Object.entries(row.values).filter(([, v]) => Number.isFinite(v))) }));
}

async function main(): Promise<void> {
  let opts: Options;
  try {
    opts = parseOptions(normaliseArgv(process.argv.slice(2)));
  } catch (err) {
    process.stderr.write(`bench: ${errorMessage(err)}\n${USAGE}\n`);
    process.exitCode = 2;
    return;
  }
  const started = new Date();
  const t0 = performance.now();
  const busy0 = machineBusySeconds();
  const load0 = os.loadavg()[0];
  const own0 = selfAndReapedChildrenCpuSeconds();
  const progress = progressPrinter();
  const warnings: string[] = [];
  const rows: Row[] = [];
  let profile: ProfileSummary[] | undefined;
  let soak: SoakReport | undefined;
  let tenants: TenantsReport | undefined;
  let reconnect: ReconnectReport | undefined;
  let doors: DoorsReport | undefined;
  let upstream: Report['upstream'];
  let failed = false;
  try {
    progress(`setting up (mode ${opts.mode}, transport ${opts.transport})`);
    const env = await setUp({
      transport: opts.transport,
      params: opts.params,
      kanalCli: opts.kanalCli,
      audit: opts.audit,
      ...(opts.kanalWorkers === undefined ? {} : { kanalWorkers: opts.kanalWorkers }),
      upstreamOption: opts.upstream,
      warnings,
      progress,
    });
    upstream = env.upstreamBinaries ? { origin: env.upstreamBinaries.origin } : { absent: env.upstreamAbsent ?? '?' };

    const suites: Record<Section, () => Promise<Row[]>> = {
      throughput: () => runThroughput(env),
      transport: () => runTransport(env),
      latency: () => runLatency(env),
      loaded: () => runLoadedLatency(env),
      requests: () => runRequests(env),
      isolation: () => runIsolation(env),
      memory: () => runIdleConnections(env),
      agents: () => runAgents(env),
      start: () => runStart(env),
    };
    for (const s of opts.sections) {
      try {
        rows.push(...(await suites[s]()));
      } catch (err) {
        failed = true;
        warnings.push(`${s} failed: ${errorMessage(err)}`);
        progress(`${s} FAILED: ${errorMessage(err)}`);
      }
    }
    // Its own servers and agents, after the sections that use the main pair.
    if (opts.tenants) {
      try {
        // The hostile-agent part adds ~20 s: a smoke run (what npm test runs) takes it only when named.
        const parts = opts.tenantParts ?? TENANTS_PARTS.filter((x) => opts.mode !== 'smoke' || x !== 'hostile');
        tenants = await runTenants(env, parts);
      } catch (err) {
        failed = true;
        warnings.push(`tenants failed: ${errorMessage(err)}`);
        progress(`tenants FAILED: ${errorMessage(err)}`);
      }
    }
    // Its own servers, agents and workers too.
    if (opts.reconnect) {
      try {
        reconnect = await runReconnect(env);
      } catch (err) {
        failed = true;
        warnings.push(`reconnect failed: ${errorMessage(err)}`);
        progress(`reconnect FAILED: ${errorMessage(err)}`);
      }
    }
    // Their own pairs (with the front doors' flags where the build has them).
    for (const [name, on, run] of [
      ['scrape', opts.scrape, runScrape],
      ['socks', opts.socks, runSocks],
    ] as const) {
      if (!on) continue;
      try {
        const part = await run(env);
        doors = { rows: [...(doors?.rows ?? []), ...part.rows], notes: [...(doors?.notes ?? []), ...part.notes] };
      } catch (err) {
        failed = true;
        warnings.push(`${name} failed: ${errorMessage(err)}`);
        progress(`${name} FAILED: ${errorMessage(err)}`);
      }
    }
    // Last: every other section's figures come first, and the soak starts its own pairs.
    if (opts.soak) {
      try {
        soak = await runSoak(env);
      } catch (err) {
        failed = true;
        warnings.push(`soak failed: ${errorMessage(err)}`);
        progress(`soak FAILED: ${errorMessage(err)}`);
      }
    }
    if (opts.profile) {
      try {
        profile = await profileRun(env, opts.profile);
      } catch (err) {
        failed = true;
        warnings.push(`profile failed: ${errorMessage(err)}`);
      }
    }
    progress('stopping');
    await env.upstream?.stop();
    await env.pair.stop();
  } finally {
    await cleanUp();
    if (process.stderr.isTTY) process.stderr.write('\n');
  }
  // Everything the machine did that was not this bench: other people's work on a shared box.
  const wallS = (performance.now() - t0) / 1000;
  const backgroundCores = Math.max(0, (machineBusySeconds() - busy0 - (selfAndReapedChildrenCpuSeconds() - own0)) / wallS);
  const report: Report = {
    tool: 'kanal-bench',
    mode: opts.mode,
    transport: opts.transport,
    startedAt: started.toISOString(),
    durationS: wallS,
    machine: machineInfo(),
    backgroundCores,
    loadAvg: { start: load0, end: os.loadavg()[0] },
    params: { ...opts.params },
    upstream,
    rows: withoutNonFinite([...sideBySide(rows, 'origin' in upstream), ...rows]),
    profile,
    soak: soak && { ...soak, readings: withoutNonFinite(soak.readings), summary: withoutNonFinite(soak.summary) },
    tenants: tenants && { ...tenants, rows: withoutNonFinite(tenants.rows) },
    reconnect: reconnect && { ...reconnect, rows: withoutNonFinite(reconnect.rows) },
    doors: doors && { ...doors, rows: withoutNonFinite(doors.rows) },
    kanalCli: opts.kanalCli,
    audit: opts.audit,
    ...(opts.kanalWorkers === undefined ? {} : { kanalWorkers: opts.kanalWorkers }),
    warnings,
  };
  process.stdout.write(opts.json ? `${JSON.stringify(report, null, 2)}\n` : `${renderText(report)}\n`);
  if (failed) process.exitCode = 1;
}

main().catch(async (err: Error) => {
  process.stderr.write(`bench failed: ${err.stack ?? err.message}\n`);
  await cleanUp(1000);
  process.exitCode = 1;
});
