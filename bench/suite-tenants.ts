/**
 * 7. Tenants: one `kanal server --tenants-config` serving many clusters.
 *
 * Scale: for each of two shapes (many small tenants, fewer big ones) a server
 * is started with an empty tenants file, the file is rewritten with every
 * tenant (each its own SNI name and Unix socket), then every tenant's agents
 * connect (bench agent tunnels from helper processes, agent-swarm.ts, naming
 * their tenant by SNI and performing the dials they are asked for). RSS after
 * each step gives the memory per tenant and per agent; then one tenant is
 * changed in the file (how long until applied, until its agents are back),
 * and dials go through a few tenants' sockets, idle and while the other
 * tenants' kube-apiservers dial as fast as they can.
 *
 * Fairness: tenants A and B on one server, each with its own `kanal agent`
 * process and its own load generator: B's dial latency and bulk throughput
 * alone, and while A runs bulk downloads and a dial flood (on B's server, on a
 * server of A's own, and in the other worker of a `--workers 2` server); A's
 * refusals by its dial-rate limit come from the server's /metrics.
 *
 * Workers: a few tenants, each with its own `kanal agent` and kube-apiserver,
 * all loaded at once (dials as fast as their lanes go, then downloads) on a
 * `--workers 1` server and on a `--workers 2` one: aggregate dials/s and MB/s,
 * where the CPU went, and the RSS of the primary and its workers.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { loadCertificateAuthority } from '../kit/pki/certificate-authority.js';
import { issueAgentCertificate } from '../kit/pki/throwaway-pki.js';
import { freePort, loopbackAgentArgs, loopbackServerArgs, readyOrStopped, withPortRetry } from '../kit/launch/kanal-cli.js';
import { spawnChild, type Child } from './children.js';
import { BACKEND_HOST, kanalProgram, readPem, startLoadgen, startSwarm } from './cluster.js';
import type { Env } from './env.js';
import type { ClientConfig, FloodResult, LoadgenCommands } from './loadgen-protocol.js';
import type { SwarmCommands } from './agent-swarm.js';
import type { Worker } from './rpc.js';
import { ownerOf } from '../src/server/workers/owner.js';
import { cpuSeconds, descendantPids, machineBusySeconds, rssBytes } from './proc.js';
import type { TenantsReport, TenantsRow } from './report.js';
import { runHostile } from './suite-hostile.js';
import { inRepOrder, median, medianRatio, percentile, spread } from './stats.js';

const KiB = 1024;
const MiB = 1024 * 1024;
/** The goal: a tenant costs at most this much server memory beyond its agents and connections. */
export const GOAL_KIB_PER_TENANT = 1024;
/** Every tenant's SNI name is `<name>.<domain>`; one wildcard certificate serves them all. */
const SNI_DOMAIN = 'tenants.test';
const LOG_WAIT_MS = 180_000;
/** Dialling lanes of the other tenants' load in the scale runs, spread over their sockets in turn. */
const SCALE_LOAD_LANES = 16;

interface TenantDef {
  name: string;
  uds: string;
  allowed: string[];
  /** Settings written into its entry, e.g. { 'dial-rate': 0 } or { 'tenant-workers': 2 }; absent: the defaults. */
  limits?: Record<string, number>;
}

/** The files every tenant names: the wildcard serving pair and the agents' CA (one for all: SNI picks the tenant, the CA and the tenant's CN pin verify). */
export interface TenantCredentials {
  cert: string;
  key: string;
  ca: string;
}

const tenantName = (i: number): string => `t${String(i).padStart(4, '0')}`;
export const serverName = (tenant: string): string => `${tenant}.${SNI_DOMAIN}`;

function tenantsYaml(defs: readonly TenantDef[], c: TenantCredentials): string {
  const lines = ['apiVersion: kanal.dev/v1alpha1', 'kind: TenantsConfig'];
  if (defs.length === 0) return [...lines, 'tenants: []', ''].join('\n');
  lines.push('tenants:');
  for (const d of defs) {
    lines.push(
      `  - name: ${d.name}`,
      `    server-name: [${serverName(d.name)}]`,
      `    cluster-cert: ${c.cert}`,
      `    cluster-key: ${c.key}`,
      `    cluster-ca-cert: ${c.ca}`,
      `    agent-client-subject: [CN=${d.name}-*]`,
      `    uds-name: ${d.uds}`,
      '    delete-existing-uds-file: true',
      `    allowed-destination: [${d.allowed.join(', ')}]`,
      '    max-agents-per-credential: 1',
      ...Object.entries(d.limits ?? {}).map(([k, v]) => `    ${k}: ${v}`),
    );
  }
  return `${lines.join('\n')}\n`;
}

let writes = 0;

/** Replaces `file` in one rename (written beside its directory, so the server's watch sees one change). */
export function writeTenantsFile(file: string, defs: readonly TenantDef[], c: TenantCredentials): void {
  const tmp = path.join(path.dirname(path.dirname(file)), `.tenants-${process.pid}-${++writes}.yaml`);
  fs.writeFileSync(tmp, tenantsYaml(defs, c));
  fs.renameSync(tmp, file);
}

type LogRecord = Record<string, unknown> & { msg?: string; time?: unknown };

/** When the server wrote a line (Date.now() ms; its log's ISO time, ms precision), or now when it carries none. */
function loggedAt(r: LogRecord): number {
  const t = typeof r.time === 'string' ? Date.parse(r.time) : typeof r.time === 'number' ? r.time : Number.NaN;
  return Number.isFinite(t) ? t : Date.now();
}

/** Reads a server's JSON log lines as they are appended. */
class LogTail {
  private offset = 0;
  private partial = '';

  constructor(readonly file: string) {}

  /** Only lines written from now on count. */
  mark(): void {
    try {
      this.offset = fs.statSync(this.file).size;
    } catch {
      this.offset = 0;
    }
    this.partial = '';
  }

  private readNew(): LogRecord[] {
    let fd: number;
    try {
      fd = fs.openSync(this.file, 'r');
    } catch {
      return [];
    }
    try {
      const size = fs.fstatSync(fd).size;
      if (size <= this.offset) return [];
      const buf = Buffer.alloc(size - this.offset);
      fs.readSync(fd, buf, 0, buf.length, this.offset);
      this.offset = size;
      const text = this.partial + buf.toString('utf8');
      const lines = text.split('\n');
      this.partial = lines.pop() ?? '';
      return lines.flatMap((line) => {
        try {
          return [JSON.parse(line) as LogRecord];
        } catch {
          return [];
        }
      });
    } finally {
      fs.closeSync(fd);
    }
  }

  /** The first line since mark() (or the last line returned) with message `msg` that `match` accepts. */
  async waitFor(msg: string, match: (r: LogRecord) => boolean = () => true, timeoutMs = LOG_WAIT_MS): Promise<LogRecord> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      for (const r of this.readNew()) {
        if (r.msg === msg && match(r)) return r;
        if (r.msg === 'tenants file refused: the running tenants stay as they are')
          throw new Error(`the server refused the tenants file: ${JSON.stringify(r.mistakes ?? r.err ?? r).slice(0, 600)}`);
      }
      if (Date.now() > deadline) throw new Error(`no log line "${msg}" within ${timeoutMs} ms in ${this.file}`);
      await sleep(5);
    }
  }
}

export interface TenantsServer {
  child: Child;
  agentPort: number;
  healthUrl: string;
  log: LogTail;
}

/** A server of the tenants in `file`; `workers`: its --workers (absent: none given, one process). */
export function startTenantsServer(env: Env, tag: string, file: string, workers?: number): Promise<TenantsServer> {
  let attempt = 0;
  // Each attempt its own log file: LogTail reads a file from its start.
  return withPortRetry(() => startTenantsServerOnce(env, tag, file, workers, ++attempt));
}

/** One attempt of startTenantsServer on fresh ports (withPortRetry). */
async function startTenantsServerOnce(
  env: Env,
  tag: string,
  file: string,
  workers: number | undefined,
  attempt: number,
): Promise<TenantsServer> {
  const [agentPort, healthPort] = await Promise.all([freePort(), freePort()]);
  const logFile = path.join(env.dir, attempt === 1 ? `${tag}-server.log` : `${tag}-server-${attempt}.log`);
  const child = spawnChild({
    name: `${tag}-server`,
    ...kanalProgram(env.kanalCli),
    logFile,
    args: [
      ...loopbackServerArgs({ pki: env.pki, agentPort, healthPort, clusterCa: false }),
      '--tenants-config',
      file,
      '--admin-port',
      '0',
      '--server-id',
      tag,
      '--transport',
      env.transport,
      '--log-level',
      'info',
      ...(workers === undefined ? [] : ['--workers', String(workers)]),
    ],
  });
  const healthUrl = `http://127.0.0.1:${healthPort}`;
  await readyOrStopped(child, `${healthUrl}/healthz`, 60_000);
  return { child, agentPort, healthUrl, log: new LogTail(logFile) };
}

/** A `kanal agent` of one tenant: SNI names the tenant, its own certificate; it performs the server's dials. */
export async function startTenantAgent(env: Env, tag: string, agentPort: number, tenant: string): Promise<Child> {
  // CN starts with the tenant's name: its entry pins CN=<tenant>-* (tenants sharing one agents CA must be told apart).
  const agentID = `${tenant}-${tag}-node`;
  const cred = await issueAgentCertificate(env.pki, agentID);
  return withPortRetry(() => startTenantAgentOnce(env, tag, agentPort, tenant, agentID, cred));
}

/** One attempt of startTenantAgent on a fresh health port (withPortRetry). */
async function startTenantAgentOnce(
  env: Env,
  tag: string,
  agentPort: number,
  tenant: string,
  agentID: string,
  cred: { cert: string; key: string },
): Promise<Child> {
  const health = await freePort();
  const child = spawnChild({
    name: `${tag}-agent`,
    ...kanalProgram(env.kanalCli),
    logFile: path.join(env.dir, `${tag}-agent.log`),
    args: [
      ...loopbackAgentArgs({ agentPort, caCert: env.pki.caCert, credential: cred, agentID, healthPort: health }),
      '--tls-server-name',
      serverName(tenant),
      '--admin-server-port',
      '0',
      '--transport',
      env.transport,
      '--log-level',
      'info',
    ],
  });
  await readyOrStopped(child, `http://127.0.0.1:${health}/readyz`, 30_000);
  return child;
}

/** One wildcard serving pair for every tenant's SNI name, issued by the throwaway CA the agents trust. */
async function tenantCredentials(env: Env): Promise<TenantCredentials> {
  const dir = path.join(env.dir, 'tenant-pki');
  const c = { cert: path.join(dir, 'serving.crt'), key: path.join(dir, 'serving.key'), ca: env.pki.caCert };
  if (fs.existsSync(c.cert)) return c;
  fs.mkdirSync(dir, { recursive: true });
  const ca = await loadCertificateAuthority(readPem(env.pki.caCert), readPem(env.pki.caKey));
  const pair = await ca.issue({ commonName: `*.${SNI_DOMAIN}`, dnsNames: [`*.${SNI_DOMAIN}`], usage: 'server' });
  fs.writeFileSync(c.key, pair.keyPem, { mode: 0o600 });
  fs.writeFileSync(c.cert, pair.certPem);
  return c;
}

/** The lowest RSS of `pid` over `ms` (read every 250 ms): a reading after the reclaimer's collection and malloc_trim. */
async function lowestRss(pid: number, ms: number): Promise<number> {
  return lowestOf(() => rssBytes(pid), ms);
}

/** The lowest of `read()` over `ms`, read every 250 ms. */
async function lowestOf(read: () => number, ms: number): Promise<number> {
  let low = read();
  const end = Date.now() + ms;
  while (Date.now() < end) {
    await sleep(Math.min(250, Math.max(1, end - Date.now())));
    low = Math.min(low, read());
  }
  return low;
}

async function scrape(url: string): Promise<{ text: string; ms: number }> {
  const t0 = performance.now();
  const text = await (await fetch(url, { signal: AbortSignal.timeout(30_000) })).text();
  return { text, ms: performance.now() - t0 };
}

/** Sum of a metric's series whose labels include every `labels` pair (0 when none). */
function metricSum(text: string, metric: string, labels: Record<string, string> = {}): number {
  let sum = 0;
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${metric}{`) && !line.startsWith(`${metric} `)) continue;
    if (!Object.entries(labels).every(([k, v]) => line.includes(`${k}="${v}"`))) continue;
    sum += Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return sum;
}

/** Issues every agent's certificate (CN = agentID) before any RSS is read, 50 at a time. */
async function issueAll(env: Env, ids: readonly string[]): Promise<void> {
  for (let i = 0; i < ids.length; i += 50) await Promise.all(ids.slice(i, i + 50).map((id) => issueAgentCertificate(env.pki, id)));
}

/** Runs `task` on every item, at most `concurrency` at once. */
async function eachLimited<T>(items: readonly T[], concurrency: number, task: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(concurrency, items.length) }, async () => {
      while (next < items.length) await task(items[next++]);
    }),
  );
}

/** Waits until neither loadgen worker has a socket open. */
export async function waitWorkersIdle(env: Env, workers: readonly Worker<LoadgenCommands>[], timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const counts = await Promise.all(workers.map((w) => w.call('counters', null)));
    if (counts.every((c) => c.open === 0)) return;
    if (Date.now() > deadline) {
      env.warnings.push(`tenants: connections still open ${timeoutMs} ms after a run (${counts.map((c) => c.open).join(', ')})`);
      return;
    }
    await sleep(20);
  }
}

export function failuresWarning(env: Env, what: string, r: { errors: number; firstError?: string }): void {
  if (r.errors > 0) env.warnings.push(`tenants: ${what}: ${r.errors} failure(s), first: ${r.firstError ?? '?'}`);
}

/** A load generator's configuration: the backend, its CONNECTs to `uds` (a tenant's socket) as the 'kanal-cp' path. */
function clientConfig(env: Env, uds: string): ClientConfig {
  return {
    caPem: readPem(env.pki.caCert),
    uds: { kanal: uds },
    backendHost: BACKEND_HOST,
    backend: env.ports,
    nodeHost: BACKEND_HOST,
    node: { bulk: 0, echo: 0, http: 0 },
    chunkBytes: env.params.chunkBytes,
  };
}

/** A loadgen worker aimed at the backend, its CONNECTs going to `uds` unless a command names another socket. */
export async function tenantClient(env: Env, name: string, uds: string): Promise<Worker<LoadgenCommands>> {
  const w = startLoadgen(env.dir, name);
  await w.call('configure', clientConfig(env, uds));
  return w;
}

/** One bulk download through `client`'s kube-apiserver path, one flow: MB/s over measureMs after warmupMs, counted by that client alone. */
export async function oneFlowDownload(env: Env, client: Worker<LoadgenCommands>, group: string, maxBytesPerFlow: number): Promise<number> {
  const p = env.params;
  await client.call('openFlows', { group, path: 'kanal-cp', mode: 'down', count: 1, maxBytesPerFlow }, 30_000);
  try {
    await sleep(p.warmupMs);
    const c0 = await client.call('counters', null);
    await sleep(p.measureMs);
    const c1 = await client.call('counters', null);
    const end = c1.t - c1.lastRxAt > 20 ? c1.lastRxAt : c1.t;
    return (c1.rx - c0.rx) / ((end - c0.t) / 1000) / 1e6;
  } finally {
    await client.call('stopFlows', { group });
  }
}

/** A server's processes: with --workers, the primary and its workers (its children), read afresh. */
function serverPids(server: TenantsServer): number[] {
  return [server.child.pid, ...descendantPids(server.child.pid)];
}

/** Summed VmRSS of a server's processes (the primary and every worker). */
export function serverRss(server: TenantsServer): number {
  return serverPids(server).reduce((sum, pid) => sum + rssBytes(pid), 0);
}

/** Which worker holds each tenant, from a --workers server's /readyz ("worker 1: ready (pid …); …" then "  tenant NAME: …" lines). */
function tenantsByWorker(detail: string): Map<string, string> {
  const out = new Map<string, string>();
  let worker: string | undefined;
  for (const line of detail.split('\n')) {
    const w = /^worker (\d+):/.exec(line);
    if (w) worker = w[1];
    const t = /^\s+tenant (.+?): /.exec(line);
    if (t && worker !== undefined) out.set(t[1], worker);
  }
  return out;
}

/** Warns unless the server's /readyz lists each tenant under the worker ownerOf() places it in. */
async function checkPlacement(env: Env, what: string, server: TenantsServer, tenants: readonly string[], workers: number): Promise<void> {
  const placed = tenantsByWorker((await scrape(`${server.healthUrl}/readyz`)).text);
  for (const t of tenants) {
    const seen = placed.get(t);
    if (seen !== String(ownerOf(t, workers)))
      env.warnings.push(`tenants ${what}: /readyz lists tenant ${t} in worker ${seen ?? '?'}, ownerOf says ${ownerOf(t, workers)}`);
  }
}

// ------------------------------------------------------------------ scale

interface Scale {
  tenants: number;
  agentsPerTenant: number;
}

/** Which swarm worker holds which tenants' agents. */
interface SwarmPlan {
  worker: Worker<SwarmCommands>;
  tenants: string[];
}

async function runScale(env: Env, s: Scale, creds: TenantCredentials): Promise<TenantsRow[]> {
  const p = env.params;
  const key = `${s.tenants}x${s.agentsPerTenant}`;
  const label = `${s.tenants} tenants x ${s.agentsPerTenant} agents`;
  const dir = path.join(env.dir, `tenants-${key}`);
  fs.mkdirSync(dir, { recursive: true });
  const file = path.join(dir, 'tenants.yaml');
  const names = Array.from({ length: s.tenants }, (_, i) => tenantName(i));
  const allowedA = [`${BACKEND_HOST}:${env.ports.echoTcp}`];
  const allowedB = [`${BACKEND_HOST}:${env.ports.httpTcp}`];
  const defs = names.map((name) => ({ name, uds: path.join(dir, `${name}.sock`), allowed: allowedA }));
  const totalAgents = s.tenants * s.agentsPerTenant;

  env.progress(`tenants ${label}: issuing ${totalAgents} agent certificates`);
  await issueAll(
    env,
    names.flatMap((n) => Array.from({ length: s.agentsPerTenant }, (_, k) => `${n}-${k}`)),
  );

  writeTenantsFile(file, [], creds);
  const server = await startTenantsServer(env, `tenants-${key}`, file);
  const swarmCount = Math.max(1, Math.ceil(totalAgents / p.agentsPerSwarm));
  const plans: SwarmPlan[] = Array.from({ length: swarmCount }, (_, i) => ({
    worker: startSwarm(env.dir, `tenants-swarm-${key}-${i}`),
    tenants: names.filter((_, t) => t % swarmCount === i),
  }));
  const load = await tenantClient(env, `tenants-load-${key}`, defs[0].uds);
  const rows: TenantsRow[] = [];
  try {
    env.progress(`tenants ${label}: server with an empty tenants file`);
    const emptyRss = await lowestRss(server.child.pid, p.tenantSettleMs);
    const empty = await scrape(`${server.healthUrl}/metrics`);

    env.progress(`tenants ${label}: declaring ${s.tenants} tenants`);
    server.log.mark();
    const t0 = Date.now();
    writeTenantsFile(file, defs, creds);
    const declared = await server.log.waitFor('tenants file applied', (r) => r.tenants === s.tenants);
    const declareMs = loggedAt(declared) - t0;
    const declaredRss = await lowestRss(server.child.pid, p.tenantSettleMs);
    const full = await scrape(`${server.healthUrl}/metrics`);

    // One tenant per helper first: what a helper allocates once stays out of the agent side's figure.
    const target = `127.0.0.1:${server.agentPort}`;
    const common = { target, pki: env.pki, transport: env.transport, from: 0, count: s.agentsPerTenant, dial: true, reconnect: true };
    const connectTenant = async (w: Worker<SwarmCommands>, name: string): Promise<{ made: number; errors: number; firstError?: string }> =>
      w.call('connect', { ...common, idPrefix: name, serverName: serverName(name), concurrency: Math.min(8, s.agentsPerTenant) }, 600_000);
    let made = 0;
    let errors = 0;
    let firstError: string | undefined;
    const note = (r: { made: number; errors: number; firstError?: string }): void => {
      made += r.made;
      errors += r.errors;
      firstError ??= r.firstError;
    };
    env.progress(`tenants ${label}: connecting ${totalAgents} agents from ${swarmCount} helper process(es)`);
    for (const plan of plans) if (plan.tenants.length > 0) note(await connectTenant(plan.worker, plan.tenants[0]));
    const warmMade = made;
    const sideBefore = plans.reduce((sum, pl) => sum + rssBytes(pl.worker.pid), 0);
    const c0 = performance.now();
    await Promise.all(
      plans.map((plan) =>
        eachLimited(plan.tenants.slice(1), Math.max(1, Math.ceil(16 / s.agentsPerTenant)), async (n) =>
          note(await connectTenant(plan.worker, n)),
        ),
      ),
    );
    const connectMs = performance.now() - c0;
    if (errors > 0) env.warnings.push(`tenants ${label}: ${errors} agent(s) failed to connect, first: ${firstError ?? '?'}`);
    if (made === 0) throw new Error(`tenants ${label}: no agent connected (${firstError ?? 'no error'})`);
    const connectedRss = await lowestRss(server.child.pid, p.tenantSettleMs);
    const sideAfter = plans.reduce((sum, pl) => sum + rssBytes(pl.worker.pid), 0);
    const seen = metricSum((await scrape(`${server.healthUrl}/metrics`)).text, 'kanal_server_agents');
    if (seen !== made)
      env.warnings.push(`tenants ${label}: the server counts ${seen} agents (kanal_server_agents), the helpers hold ${made}`);

    const kibPerTenant = (declaredRss - emptyRss) / s.tenants / KiB;
    if (kibPerTenant > GOAL_KIB_PER_TENANT)
      env.warnings.push(
        `tenants ${label}: ${kibPerTenant.toFixed(0)} KiB of server RSS per tenant, over the goal of ${GOAL_KIB_PER_TENANT} KiB`,
      );
    const heap = (text: string): number => metricSum(text, 'nodejs_heap_size_used_bytes');
    rows.push({
      id: `tenants.scale.${key}`,
      table: 'scale',
      label,
      values: {
        tenants: s.tenants,
        agents: made,
        emptyRssMiB: emptyRss / MiB,
        declaredRssMiB: declaredRss / MiB,
        connectedRssMiB: connectedRss / MiB,
        kibPerTenant,
        heapKiBPerTenant: (heap(full.text) - heap(empty.text)) / s.tenants / KiB,
        kibPerAgent: (connectedRss - declaredRss) / made / KiB,
        agentSideKiBPerAgent: made > warmMade ? (sideAfter - sideBefore) / (made - warmMade) / KiB : Number.NaN,
        declareMs,
        connectPerS: ((made - warmMade) * 1000) / connectMs,
        metricsKiBPerTenant: (full.text.length - empty.text.length) / s.tenants / KiB,
        metricsScrapeMs: full.ms,
      },
      signed: ['kibPerTenant', 'heapKiBPerTenant', 'kibPerAgent', 'agentSideKiBPerAgent'],
    });

    rows.push(await reloadOne(env, s, label, key, { server, file, defs, creds, plans, allowed: [allowedA, allowedB] }));
    rows.push(await scaleDials(env, label, key, { defs, load }));
  } finally {
    await Promise.all(plans.map((pl) => pl.worker.call('closeAll', null, 30_000).catch(() => null)));
    await Promise.all([...plans.map((pl) => pl.worker.child.stop()), load.child.stop()]);
    await server.child.stop();
  }
  return rows;
}

/** One tenant's allowed-destination changed, `reps` times: write -> applied, write -> its agents back. */
async function reloadOne(
  env: Env,
  s: Scale,
  label: string,
  key: string,
  o: {
    server: TenantsServer;
    file: string;
    defs: TenantDef[];
    creds: TenantCredentials;
    plans: SwarmPlan[];
    allowed: [string[], string[]];
  },
): Promise<TenantsRow> {
  const index = Math.floor(o.defs.length / 2);
  const name = o.defs[index].name;
  const holder = o.plans.find((pl) => pl.tenants.includes(name))!;
  const applied: number[] = [];
  const back: number[] = [];
  const cpu: number[] = [];
  let kept = 0;
  for (let rep = 0; rep < env.params.reps; rep++) {
    env.progress(`tenants ${label}: changing tenant ${name}, run ${rep + 1}/${env.params.reps}`);
    const defs = o.defs.map((d, i) => (i === index ? { ...d, allowed: o.allowed[(rep + 1) % 2] } : d));
    o.server.log.mark();
    const cpu0 = cpuSeconds(o.server.child.pid);
    const t0 = Date.now();
    writeTenantsFile(o.file, defs, o.creds);
    const r = await o.server.log.waitFor('tenants file applied');
    cpu.push((cpuSeconds(o.server.child.pid) - cpu0) * 1000);
    const changed = Array.isArray(r.changed) ? (r.changed as unknown[]) : [];
    if (changed.length !== 1 || changed[0] !== name)
      env.warnings.push(
        `tenants ${label}: a change of tenant ${name} applied as changed ${JSON.stringify(changed)}, added ${JSON.stringify(r.added)}`,
      );
    applied.push(loggedAt(r) - t0);
    // An allow-list change is applied in place (the log's inPlace): the tenant's agents stay, none to wait for.
    const inPlace = Array.isArray(r.inPlace) && (r.inPlace as unknown[]).includes(name);
    if (inPlace) kept++;
    const deadline = Date.now() + 30_000;
    while (!inPlace) {
      const b = await holder.worker.call('reconnected', { idPrefix: name, since: t0 });
      if (b.count >= s.agentsPerTenant) {
        back.push(b.lastAt - t0);
        break;
      }
      if (Date.now() > deadline) {
        env.warnings.push(`tenants ${label}: ${b.count} of tenant ${name}'s ${s.agentsPerTenant} agents back 30 s after its change`);
        break;
      }
      await sleep(10);
    }
    // The change is the file's state now: the next write differs from it again.
    o.defs.splice(0, o.defs.length, ...defs);
    await sleep(300);
  }
  return {
    id: `tenants.reload.${key}`,
    table: 'reload',
    label,
    values: {
      appliedMs: median(applied),
      appliedSpread: spread(applied),
      agentsBackMs: back.length > 0 ? median(back) : Number.NaN,
      reloadCpuMs: median(cpu),
      inPlaceRuns: kept,
      changedAgents: s.agentsPerTenant,
      runs: applied.length,
    },
    signed: ['inPlaceRuns'],
    runs: applied,
  };
}

/** Sequential dials through a few tenants' sockets, idle and while the other tenants flood theirs. */
async function scaleDials(
  env: Env,
  label: string,
  key: string,
  o: { defs: TenantDef[]; load: Worker<LoadgenCommands> },
): Promise<TenantsRow> {
  const p = env.params;
  const n = o.defs.length;
  const measured = [...new Set([0, Math.floor(n / 2), n - 1])].map((i) => o.defs[i]);
  const others = o.defs.filter((d) => !measured.includes(d)).map((d) => d.uds);
  const loadUds = others.length > 0 ? others : measured.map((d) => d.uds);
  const idle: number[][] = [];
  const loaded: number[][] = [];
  const loadRates: number[] = [];
  let loadRefused = 0;
  const dialAll = async (into: number[][]): Promise<void> => {
    for (const d of measured) {
      const r = await env.client.call('dials', { path: 'kanal-cp', n: p.tenantDials, concurrency: 1, uds: d.uds }, 600_000);
      failuresWarning(env, `${label}: dials through tenant ${d.name}`, r);
      into.push(r.latenciesMs);
    }
  };
  env.progress(`tenants ${label}: dial warm-up`);
  await dialAll([]);
  await o.load.call('startFlood', { id: 'warm', path: 'kanal-cp', concurrency: SCALE_LOAD_LANES, uds: loadUds });
  await sleep(500);
  await o.load.call('stopFlood', { id: 'warm' });
  await waitWorkersIdle(env, [env.client, o.load]);
  for (let rep = 0; rep < p.reps; rep++) {
    for (const phase of inRepOrder(['idle', 'loaded'] as const, rep)) {
      env.progress(`tenants ${label}: dials through ${measured.length} tenants, ${phase}, run ${rep + 1}/${p.reps}`);
      if (phase === 'idle') {
        await dialAll(idle);
      } else {
        const id = `load-${rep}`;
        await o.load.call('startFlood', { id, path: 'kanal-cp', concurrency: SCALE_LOAD_LANES, uds: loadUds });
        let flood: FloodResult | undefined;
        try {
          await sleep(300);
          await dialAll(loaded);
        } finally {
          flood = await o.load.call('stopFlood', { id }, 60_000);
        }
        failuresWarning(env, `${label}: the other tenants' dials`, flood);
        // Few load tenants (a small run) may go over their own dial-rate: counted, not a failure.
        loadRefused += Object.values(flood.refused).reduce((a, b) => a + b, 0);
        loadRates.push((flood.ok * 1000) / flood.elapsedMs);
      }
      await waitWorkersIdle(env, [env.client, o.load]);
    }
  }
  const all = (x: number[][]): number[] => x.flat();
  const values: Record<string, number> = {
    idleP50Ms: percentile(all(idle), 50),
    idleP99Ms: percentile(all(idle), 99),
    loadedP50Ms: percentile(all(loaded), 50),
    loadedP99Ms: percentile(all(loaded), 99),
    loadDialsPerS: median(loadRates),
    loadRefused,
    loadTenants: loadUds.length,
    measuredTenants: measured.length,
    samples: all(idle).length + all(loaded).length,
  };
  values.ratioP50 = values.loadedP50Ms / values.idleP50Ms;
  values.ratioP99 = values.loadedP99Ms / values.idleP99Ms;
  return { id: `tenants.dials.${key}`, table: 'dials', label, values, signed: ['loadRefused'] };
}

// ---------------------------------------------------------------- fairness

/**
 * Where tenant A's load goes: the server B is on, a server of its own on the same machine (the control),
 * or the other worker of a `--workers 2` server where B is too.
 */
type Phase = 'alone' | 'shared' | 'own' | 'workers';
type LoadPhase = Exclude<Phase, 'alone'>;

const PHASES: readonly Phase[] = ['alone', 'shared', 'own', 'workers'];

interface ALoad {
  attempts: number[];
  ok: number[];
  refusedShare: number[];
  mbps: number[];
  rateRefused: number;
  otherRefused: number;
}

/** kanal_refusals_total of one tenant by reason, from a server's /metrics. */
async function refusalsOf(server: TenantsServer, tenant: string): Promise<Record<string, number>> {
  const text = (await scrape(`${server.healthUrl}/metrics`)).text;
  const out: Record<string, number> = {};
  for (const m of text.matchAll(/^kanal_refusals_total\{([^}]*)\} (\S+)$/gm)) {
    if (!m[1].includes(`tenant="${tenant}"`)) continue;
    const reason = /reason="([^"]*)"/.exec(m[1])?.[1] ?? '?';
    out[reason] = (out[reason] ?? 0) + Number(m[2]);
  }
  return out;
}

/**
 * Tenant B alone, next to tenant A's load on the same server, next to the
 * same load through a server of A's own on the same machine (what the shared
 * server costs B beyond the cores the two share), and next to it in the other
 * worker of one `--workers 2` server.
 */
async function runFairness(env: Env, creds: TenantCredentials): Promise<TenantsRow[]> {
  const p = env.params;
  const dir = path.join(env.dir, 'tenants-fairness');
  fs.mkdirSync(dir, { recursive: true });
  const allowed = [`${BACKEND_HOST}:${env.ports.echoTcp}`];
  const [a, b] = ['a', 'b'].map((name) => ({ name, uds: path.join(dir, `${name}.sock`), allowed }));
  const soloA = { name: 'a', uds: path.join(dir, 'own-a.sock'), allowed };
  // In the --workers 2 server, B's name is the first of b, b1, b2, ... that rendezvous hashing places in the other worker than a.
  const apart = ['b', ...Array.from({ length: 64 }, (_, i) => `b${i + 1}`)].find((n) => ownerOf(n, 2) !== ownerOf('a', 2))!;
  const workersA = { name: 'a', uds: path.join(dir, 'workers-a.sock'), allowed };
  const workersB = { name: apart, uds: path.join(dir, 'workers-b.sock'), allowed };
  const sharedFile = path.join(dir, 'shared', 'tenants.yaml');
  const soloFile = path.join(dir, 'own', 'tenants.yaml');
  const workersFile = path.join(dir, 'workers', 'tenants.yaml');
  for (const f of [sharedFile, soloFile, workersFile]) fs.mkdirSync(path.dirname(f), { recursive: true });
  writeTenantsFile(sharedFile, [a, b], creds);
  writeTenantsFile(soloFile, [soloA], creds);
  writeTenantsFile(workersFile, [workersA, workersB], creds);
  env.progress(
    `tenants fairness: a server of tenants a and b, another of a alone, a --workers 2 server of a and ${apart} (apart), a kanal agent per tenant and server`,
  );
  const servers: TenantsServer[] = [];
  const children: Child[] = [];
  const workers: Worker<LoadgenCommands>[] = [];
  try {
    servers.push(
      ...(await Promise.all([
        startTenantsServer(env, 'tenants-fair', sharedFile),
        startTenantsServer(env, 'tenants-fair-own', soloFile),
        startTenantsServer(env, 'tenants-fair-workers', workersFile, 2),
      ])),
    );
    const [shared, own, workersServer] = servers;
    children.push(
      ...(await Promise.all([
        startTenantAgent(env, 'tenant-a', shared.agentPort, 'a'),
        startTenantAgent(env, 'tenant-b', shared.agentPort, 'b'),
        startTenantAgent(env, 'tenant-a-own', own.agentPort, 'a'),
        startTenantAgent(env, 'tenant-a-workers', workersServer.agentPort, 'a'),
        startTenantAgent(env, 'tenant-b-workers', workersServer.agentPort, apart),
      ])),
    );
    /** Per phase: B's server, socket and name there, and where A's load goes (none when B is alone). */
    const plan: Record<Phase, { bServer: TenantsServer; bUds: string; bName: string; a?: { server: TenantsServer; uds: string } }> = {
      alone: { bServer: shared, bUds: b.uds, bName: 'b' },
      shared: { bServer: shared, bUds: b.uds, bName: 'b', a: { server: shared, uds: a.uds } },
      own: { bServer: shared, bUds: b.uds, bName: 'b', a: { server: own, uds: soloA.uds } },
      workers: { bServer: workersServer, bUds: workersB.uds, bName: apart, a: { server: workersServer, uds: workersA.uds } },
    };
    // A's kube-apiserver as two processes, its downloads in one and its dial flood in the other: the flood
    // then dials as fast as the server lets it, not as fast as an event loop busy with the flows can.
    const [clientA, floodA, clientB] = await Promise.all([
      tenantClient(env, 'tenant-a-client', a.uds),
      tenantClient(env, 'tenant-a-flood', a.uds),
      tenantClient(env, 'tenant-b-client', b.uds),
    ]);
    workers.push(clientA, floodA, clientB);
    const idleAll = (): Promise<void> => waitWorkersIdle(env, [clientA, floodA, clientB, env.backend]);
    const seconds = (p.warmupMs + p.measureMs) / 1000 + 5;
    const maxBytes = (flows: number): number => Math.ceil((p.capBytesPerSecond * seconds) / flows);
    let groups = 0;

    /** B's bulk download, one flow, counted by B's client alone. */
    const bBulk = (): Promise<number> => oneFlowDownload(env, clientB, `b${++groups}`, maxBytes(1));
    const bDials = async (into: number[][]): Promise<void> => {
      const r = await clientB.call('dials', { path: 'kanal-cp', n: p.tenantDials, concurrency: 1 }, 600_000);
      failuresWarning(env, "tenant B's dials", r);
      into.push(r.latenciesMs);
    };

    env.progress('tenants fairness: warm-up');
    for (const uds of [workersB.uds, b.uds]) {
      await clientB.call('configure', clientConfig(env, uds));
      await bDials([]);
      await bBulk();
    }
    for (const uds of [a.uds, soloA.uds, workersA.uds])
      await floodA.call('dials', { path: 'kanal-cp', n: p.tenantDials, concurrency: 4, uds }, 600_000);
    await idleAll();
    await checkPlacement(env, 'fairness', workersServer, ['a', apart], 2);

    const dials: Record<Phase, number[][]> = { alone: [], shared: [], own: [], workers: [] };
    const bulk: Record<Phase, number[]> = { alone: [], shared: [], own: [], workers: [] };
    const load = (): ALoad => ({ attempts: [], ok: [], refusedShare: [], mbps: [], rateRefused: 0, otherRefused: 0 });
    const aLoad: Record<LoadPhase, ALoad> = { shared: load(), own: load(), workers: load() };
    let bRefusals = 0;
    for (let rep = 0; rep < p.reps; rep++) {
      for (const phase of inRepOrder(PHASES, rep)) {
        const what = {
          alone: 'alone',
          shared: "next to A's load on its server",
          own: "next to A's load on A's own server",
          workers: "next to A's load in the other worker of a --workers 2 server",
        }[phase];
        env.progress(`tenants fairness: tenant B ${what}, run ${rep + 1}/${p.reps}`);
        const { bServer, bUds, bName, a: aPlace } = plan[phase];
        await clientB.call('configure', clientConfig(env, bUds));
        const bBefore = await refusalsOf(bServer, bName);
        if (phase === 'alone' || !aPlace) {
          await bDials(dials.alone);
          bulk.alone.push(await bBulk());
        } else {
          const { server, uds } = aPlace;
          const into = aLoad[phase];
          const before = await refusalsOf(server, 'a');
          await Promise.all([clientA, floodA].map((w) => w.call('configure', clientConfig(env, uds))));
          const group = `a${++groups}`;
          const flood = `flood-${rep}-${phase}`;
          await clientA.call(
            'openFlows',
            { group, path: 'kanal-cp', mode: 'down', count: p.tenantBulkFlows, maxBytesPerFlow: maxBytes(p.tenantBulkFlows) },
            30_000,
          );
          let result: FloodResult | undefined;
          try {
            await floodA.call('startFlood', { id: flood, path: 'kanal-cp', concurrency: p.tenantFloodConcurrency });
            await sleep(p.warmupMs);
            const rx0 = await clientA.call('counters', null);
            await bDials(dials[phase]);
            bulk[phase].push(await bBulk());
            const rx1 = await clientA.call('counters', null);
            into.mbps.push((rx1.rx - rx0.rx) / ((rx1.t - rx0.t) / 1000) / 1e6);
          } finally {
            result = await floodA.call('stopFlood', { id: flood }, 60_000).catch(() => undefined);
            await clientA.call('stopFlows', { group });
          }
          if (result) {
            failuresWarning(env, "tenant A's dial flood", result);
            const refused = Object.values(result.refused).reduce((x, y) => x + y, 0);
            const tried = result.ok + refused + result.errors;
            into.attempts.push((tried * 1000) / result.elapsedMs);
            into.ok.push((result.ok * 1000) / result.elapsedMs);
            into.refusedShare.push(tried > 0 ? refused / tried : 0);
          }
          const after = await refusalsOf(server, 'a');
          for (const [reason, v] of Object.entries(after)) {
            const d = v - (before[reason] ?? 0);
            if (reason === 'tenant_dial_rate') into.rateRefused += d;
            else into.otherRefused += d;
          }
        }
        const bAfter = await refusalsOf(bServer, bName);
        bRefusals += Object.entries(bAfter).reduce((n, [reason, v]) => n + v - (bBefore[reason] ?? 0), 0);
        await idleAll();
      }
    }
    if (bRefusals > 0)
      env.warnings.push(
        `tenants fairness: tenant B had ${bRefusals} refusal(s) of its own (kanal_refusals_total{tenant="b"} or "${apart}")`,
      );
    const pooled = (x: number[][]): number[] => x.flat();
    const latencyRow = (q: 50 | 99): TenantsRow => {
      const at = (phase: Phase): number => percentile(pooled(dials[phase]), q);
      return {
        id: `tenants.fairness.b-dial-p${q}`,
        table: 'fairness',
        label: `B dial latency p${q}, ms (sequential)`,
        values: {
          alone: at('alone'),
          shared: at('shared'),
          own: at('own'),
          workers: at('workers'),
          ratioShared: at('shared') / at('alone'),
          ratioOwn: at('own') / at('alone'),
          ratioWorkers: at('workers') / at('alone'),
          sharedVsOwn: at('shared') / at('own'),
          workersVsOwn: at('workers') / at('own'),
          aloneSpread: spread(dials.alone.map((x) => percentile(x, q))),
          sharedSpread: spread(dials.shared.map((x) => percentile(x, q))),
          workersSpread: spread(dials.workers.map((x) => percentile(x, q))),
          samples: PHASES.reduce((n, phase) => n + pooled(dials[phase]).length, 0),
        },
        signed: ['aloneSpread', 'sharedSpread', 'workersSpread'],
      };
    };
    const loadRow = (phase: LoadPhase): TenantsRow => {
      const l = aLoad[phase];
      return {
        id: `tenants.fairness.a-load${{ shared: '', own: '.own-server', workers: '.other-worker' }[phase]}`,
        table: 'load',
        label: { shared: "A on B's server", own: 'A on its own server', workers: "A in the other worker of B's --workers 2" }[phase],
        values: {
          attemptsPerS: median(l.attempts),
          okPerS: median(l.ok),
          rateRefused: l.rateRefused,
          otherRefused: l.otherRefused,
          refusedShare: median(l.refusedShare),
          bulkMbps: median(l.mbps),
          runs: l.attempts.length,
        },
        signed: ['rateRefused', 'otherRefused', 'refusedShare'],
      };
    };
    return [
      latencyRow(50),
      latencyRow(99),
      {
        id: 'tenants.fairness.b-bulk',
        table: 'fairness',
        label: 'B bulk download, 1 flow, MB/s',
        values: {
          alone: median(bulk.alone),
          shared: median(bulk.shared),
          own: median(bulk.own),
          workers: median(bulk.workers),
          ratioShared: medianRatio(bulk.shared, bulk.alone),
          ratioOwn: medianRatio(bulk.own, bulk.alone),
          ratioWorkers: medianRatio(bulk.workers, bulk.alone),
          sharedVsOwn: medianRatio(bulk.shared, bulk.own),
          workersVsOwn: medianRatio(bulk.workers, bulk.own),
          aloneSpread: spread(bulk.alone),
          sharedSpread: spread(bulk.shared),
          workersSpread: spread(bulk.workers),
          samples: PHASES.reduce((n, phase) => n + bulk[phase].length, 0),
        },
        signed: ['aloneSpread', 'sharedSpread', 'workersSpread'],
        runs: PHASES.flatMap((phase) => bulk[phase]).map((x) => Math.round(x)),
      },
      loadRow('shared'),
      loadRow('own'),
      loadRow('workers'),
    ];
  } finally {
    await Promise.all([...workers.map((w) => w.child.stop()), ...children.map((c) => c.stop())]);
    await Promise.all(servers.map((s) => s.child.stop()));
  }
}

// ----------------------------------------------------------------- workers

/** One server of a workers comparison: `--workers n`, each tenant of `tenant-workers: share`. */
interface WorkersSetup {
  n: number;
  share: number;
}

/**
 * A comparison of servers loaded alike: 7f spreads tenants over `--workers 1`
 * and `--workers 2`; its shared rows serve one busy tenant on `--workers 2` with
 * `tenant-workers: 1` and `2` (docs/multi-tenant.md, "A busy tenant on
 * several workers"). Ratios are to the first setup.
 */
interface WorkersShape {
  part: 'workers' | 'shared';
  names: string[];
  setups: WorkersSetup[];
  /** Dialling lanes of each tenant's kube-apiserver. */
  lanes: number;
  /** Parallel downloads of each tenant's kube-apiserver. */
  flows: number;
  id(kind: 'dials' | 'bulk', setup: WorkersSetup): string;
  label(kind: 'dials' | 'bulk', setup: WorkersSetup): string;
}

/** The worker counts compared in 7f. */
const WORKER_COUNTS = [1, 2] as const;

function workersShape(env: Env): WorkersShape {
  const p = env.params;
  const names = namesSpread('w', p.tenantWorkersTenants, Math.max(...WORKER_COUNTS));
  return {
    part: 'workers',
    names,
    setups: WORKER_COUNTS.map((n) => ({ n, share: 1 })),
    lanes: p.tenantWorkersLanes,
    flows: p.tenantBulkFlows,
    id: (kind, st) => `tenants.workers.${kind}.w${st.n}`,
    label: (kind, st) => `${kind === 'dials' ? 'dials/s' : 'download MB/s'}, ${names.length} tenants, --workers ${st.n}`,
  };
}

/** One tenant with the load of all of 7f's (its lanes and flows times their count), on one worker and on two. */
function sharedShape(env: Env): WorkersShape {
  const p = env.params;
  return {
    part: 'shared',
    names: ['busy'],
    setups: [1, 2].map((share) => ({ n: 2, share })),
    lanes: p.tenantWorkersLanes * p.tenantWorkersTenants,
    flows: p.tenantBulkFlows * p.tenantWorkersTenants,
    id: (kind, st) => `tenants.shared.${kind}.k${st.share}`,
    label: (kind, st) => `${kind === 'dials' ? 'dials/s' : 'download MB/s'}, one tenant of tenant-workers: ${st.share}, --workers ${st.n}`,
  };
}

/** Waits until each of `share` workers holds the agent of `tenant` (its series carry `worker` once shared); a warning if not. */
async function waitShared(env: Env, server: TenantsServer, tenant: string, share: number): Promise<void> {
  const deadline = Date.now() + 30_000;
  const held = async (): Promise<number> => {
    const { text } = await scrape(`${server.healthUrl}/metrics`);
    let n = 0;
    for (let w = 0; w < share; w++) if (metricSum(text, 'kanal_server_agents', { tenant, worker: String(w) }) > 0) n++;
    return n;
  };
  while (Date.now() < deadline) {
    if ((await held()) === share) return;
    await sleep(200);
  }
  env.warnings.push(`tenants shared: tenant ${tenant}'s agent did not reach all ${share} of its workers within 30 s`);
}

/** `count` names `<prefix><k>`, the i-th one placed in worker i % workers by rendezvous hashing (ownerOf). */
function namesSpread(prefix: string, count: number, workers: number): string[] {
  const names: string[] = [];
  for (let k = 0; names.length < count; k++) if (ownerOf(`${prefix}${k}`, workers) === names.length % workers) names.push(`${prefix}${k}`);
  return names;
}

/** CPU seconds of each process at one moment, with the machine's busy seconds. */
interface CpuSnapshot {
  t: number;
  machine: number;
  per: Map<number, number>;
}

function cpuSnapshot(pids: readonly number[]): CpuSnapshot {
  return { t: performance.now(), machine: machineBusySeconds(), per: new Map(pids.map((pid) => [pid, cpuSeconds(pid)])) };
}

/** Cores each group of processes kept busy between two snapshots, the busiest of `busiestOf`, and the machine's. */
function coresBetween(
  s0: CpuSnapshot,
  s1: CpuSnapshot,
  groups: Record<string, readonly number[]>,
  busiestOf: readonly number[],
): Record<string, number> {
  const seconds = (s1.t - s0.t) / 1000;
  const used = (pid: number): number => ((s1.per.get(pid) ?? 0) - (s0.per.get(pid) ?? 0)) / seconds;
  const out: Record<string, number> = { machine: (s1.machine - s0.machine) / seconds, busiest: Math.max(0, ...busiestOf.map(used)) };
  for (const [name, pids] of Object.entries(groups)) out[name] = pids.reduce((sum, pid) => sum + used(pid), 0);
  return out;
}

/** One run of all tenants' load on one server: the aggregate rate and where the CPU went. */
interface WorkersSample {
  rate: number;
  /** The slowest tenant's rate over an even share (1: all equal). */
  slowestShare: number;
  cores: Record<string, number>;
  rssBytes: number;
  processes: number;
}

/**
 * Several tenants, each with its own `kanal agent` and kube-apiserver (a load generator), loaded at
 * once on a `--workers 1` server and on a `--workers 2` server (dial-rate off): the aggregate dials/s
 * and download MB/s, runs interleaved, the CPU of server, agents and the rest, and the servers' RSS.
 */
async function runWorkers(env: Env, creds: TenantCredentials, shape: WorkersShape): Promise<TenantsRow[]> {
  const p = env.params;
  const what = `tenants ${shape.part}`;
  const dir = path.join(env.dir, `tenants-${shape.part}`);
  const names = shape.names;
  const allowed = [`${BACKEND_HOST}:${env.ports.echoTcp}`];
  const T = names.length;
  env.progress(
    `${what}: ${T} tenant(s) (${names.map((n) => `${n} first in worker ${ownerOf(n, 2)}`).join(', ')}), servers of ${shape.setups.map((st) => `--workers ${st.n} tenant-workers ${st.share}`).join(' and ')}, a kanal agent per tenant and server`,
  );
  const setups = shape.setups.map((st, i) => {
    const sub = path.join(dir, `s${i}`);
    fs.mkdirSync(sub, { recursive: true });
    const file = path.join(sub, 'tenants.yaml');
    const limits = { 'dial-rate': 0, ...(st.share > 1 ? { 'tenant-workers': st.share } : {}) };
    const defs = names.map((name) => ({ name, uds: path.join(sub, `${name}.sock`), allowed, limits }));
    writeTenantsFile(file, defs, creds);
    return { ...st, file, defs };
  });
  const servers: TenantsServer[] = [];
  const agents: Child[][] = [];
  const clients: Worker<LoadgenCommands>[] = [];
  try {
    servers.push(...(await Promise.all(setups.map((st, i) => startTenantsServer(env, `tenants-${shape.part}-${i}`, st.file, st.n)))));
    agents.push(
      ...(await Promise.all(
        setups.map((_, i) =>
          Promise.all(names.map((name) => startTenantAgent(env, `tenant-${name}-${shape.part}-${i}`, servers[i].agentPort, name))),
        ),
      )),
    );
    for (const [i, st] of setups.entries()) if (st.share > 1) for (const name of names) await waitShared(env, servers[i], name, st.share);
    clients.push(...(await Promise.all(names.map((name, t) => tenantClient(env, `tenant-${name}-kas`, setups[0].defs[t].uds)))));
    const idleAll = (): Promise<void> => waitWorkersIdle(env, [...clients, env.backend]);
    const seconds = (p.warmupMs + p.measureMs) / 1000 + 5;
    const maxBytes = Math.ceil((p.capBytesPerSecond * seconds) / (T * shape.flows));
    let runs = 0;

    const measure = async (i: number, kind: 'dials' | 'bulk'): Promise<WorkersSample> => {
      const server = servers[i];
      await Promise.all(clients.map((c, t) => c.call('configure', clientConfig(env, setups[i].defs[t].uds))));
      const pids = serverPids(server);
      const groups = { server: pids, agents: agents[i].map((a) => a.pid), others: [...clients.map((c) => c.pid), env.backend.pid] };
      const all = Object.values(groups).flat();
      const id = `workers-${++runs}`;
      let rates: number[];
      let s0: CpuSnapshot;
      let s1: CpuSnapshot;
      let rss: number;
      if (kind === 'dials') {
        s0 = cpuSnapshot(all);
        await Promise.all(clients.map((c) => c.call('startFlood', { id, path: 'kanal-cp', concurrency: shape.lanes })));
        let results: FloodResult[];
        try {
          await sleep(p.warmupMs + p.measureMs);
          rss = serverRss(server);
        } finally {
          results = await Promise.all(clients.map((c) => c.call('stopFlood', { id }, 60_000)));
        }
        s1 = cpuSnapshot(all);
        results.forEach((r, t) => {
          failuresWarning(env, `${shape.part}: tenant ${names[t]}'s dials (setup ${i})`, r);
          const refused = Object.values(r.refused).reduce((x, y) => x + y, 0);
          if (refused > 0)
            env.warnings.push(`${what}: tenant ${names[t]} had ${refused} dial(s) refused (setup ${i}): ${JSON.stringify(r.refused)}`);
        });
        rates = results.map((r) => (r.ok * 1000) / r.elapsedMs);
      } else {
        await Promise.all(
          clients.map((c) =>
            c.call('openFlows', { group: id, path: 'kanal-cp', mode: 'down', count: shape.flows, maxBytesPerFlow: maxBytes }, 30_000),
          ),
        );
        try {
          await sleep(p.warmupMs);
          const c0 = await Promise.all(clients.map((c) => c.call('counters', null)));
          s0 = cpuSnapshot(all);
          await sleep(p.measureMs);
          const c1 = await Promise.all(clients.map((c) => c.call('counters', null)));
          s1 = cpuSnapshot(all);
          rss = serverRss(server);
          rates = c1.map((b, t) => {
            const end = b.t - b.lastRxAt > 20 ? b.lastRxAt : b.t;
            return (b.rx - c0[t].rx) / ((end - c0[t].t) / 1000) / 1e6;
          });
        } finally {
          await Promise.all(clients.map((c) => c.call('stopFlows', { group: id })));
        }
      }
      const total = rates.reduce((x, y) => x + y, 0);
      const later = serverPids(server);
      if (later.length !== pids.length || later.some((pid) => !pids.includes(pid)))
        env.warnings.push(`${what}: the server of setup ${i} changed its processes during a run (${pids.join(',')} -> ${later.join(',')})`);
      return {
        rate: total,
        slowestShare: total > 0 ? (Math.min(...rates) * T) / total : Number.NaN,
        cores: coresBetween(s0, s1, groups, pids),
        rssBytes: rss,
        processes: pids.length,
      };
    };

    env.progress(`${what}: warm-up`);
    for (let i = 0; i < servers.length; i++) {
      await measure(i, 'dials');
      await idleAll();
      await measure(i, 'bulk');
      await idleAll();
    }
    for (const [i, srv] of servers.entries())
      if (setups[i].n > 1 && setups[i].share === 1) await checkPlacement(env, shape.part, srv, names, setups[i].n);

    const kinds = ['dials', 'bulk'] as const;
    const samples = kinds.map(() => servers.map((): WorkersSample[] => []));
    const order = servers.map((_, i) => i);
    for (let rep = 0; rep < p.reps; rep++) {
      for (const i of inRepOrder(order, rep)) {
        for (const k of inRepOrder([0, 1], rep)) {
          env.progress(`${what}: ${shape.label(kinds[k], setups[i])}, run ${rep + 1}/${p.reps}`);
          samples[k][i].push(await measure(i, kinds[k]));
          await idleAll();
        }
      }
    }
    env.progress(`${what}: servers' RSS at rest (lowest over ${(p.tenantSettleMs / 1000).toFixed(1)} s)`);
    const idleRss = await Promise.all(servers.map((srv) => lowestOf(() => serverRss(srv), p.tenantSettleMs)));

    const rows: TenantsRow[] = [];
    kinds.forEach((kind, k) => {
      servers.forEach((_, i) => {
        const xs = samples[k][i];
        const rates = xs.map((x) => x.rate);
        const cores = (key: string): number => median(xs.map((x) => x.cores[key]));
        const values: Record<string, number> = {
          rate: median(rates),
          rateSpread: spread(rates),
          slowestShare: median(xs.map((x) => x.slowestShare)),
          serverCores: cores('server'),
          busiestCores: cores('busiest'),
          agentCores: cores('agents'),
          otherCores: cores('others'),
          machineCores: cores('machine'),
          loadedRssMiB: Math.max(...xs.map((x) => x.rssBytes)) / MiB,
          idleRssMiB: idleRss[i] / MiB,
          processes: median(xs.map((x) => x.processes)),
          runs: xs.length,
        };
        if (i > 0)
          values.ratio = medianRatio(
            rates,
            samples[k][0].map((x) => x.rate),
          );
        rows.push({
          id: shape.id(kind, setups[i]),
          table: 'workers',
          label: shape.label(kind, setups[i]),
          values,
          runs: rates.map((r) => Math.round(r)),
        });
      });
    });
    return rows;
  } finally {
    await Promise.all([...clients.map((w) => w.child.stop()), ...agents.flat().map((c) => c.stop())]);
    await Promise.all(servers.map((srv) => srv.child.stop()));
  }
}

/** The parts of section 7; `--only hostile` runs the last alone. */
export type TenantsPart = 'scale' | 'fairness' | 'workers' | 'shared' | 'hostile';
export const TENANTS_PARTS: readonly TenantsPart[] = ['scale', 'fairness', 'workers', 'shared', 'hostile'];

export async function runTenants(env: Env, parts: readonly TenantsPart[] = TENANTS_PARTS): Promise<TenantsReport> {
  const p = env.params;
  const creds = await tenantCredentials(env);
  const rows: TenantsRow[] = [];
  if (parts.includes('scale'))
    for (const s of [
      { tenants: p.tenantsMany, agentsPerTenant: p.tenantsManyAgents },
      { tenants: p.tenantsFew, agentsPerTenant: p.tenantsFewAgents },
    ]) {
      rows.push(...(await runScale(env, s, creds)));
    }
  if (parts.includes('fairness')) rows.push(...(await runFairness(env, creds)));
  if (parts.includes('workers')) rows.push(...(await runWorkers(env, creds, workersShape(env))));
  if (parts.includes('shared')) rows.push(...(await runWorkers(env, creds, sharedShape(env))));
  if (parts.includes('hostile')) rows.push(...(await runHostile(env, creds)));
  return {
    rows,
    goalKiBPerTenant: GOAL_KIB_PER_TENANT,
    notes: [
      'Every tenant: its own SNI name (one wildcard certificate for all), Unix socket and allowed-destination; one agents CA for all',
      '(SNI picks the tenant, the CA verifies). Scale: a server started with `tenants: []`, the file then rewritten with every tenant',
      '(applied as a reload: "declare all ms"), then every agent connected: bench agent tunnels (agent-swarm.ts), each its own',
      `certificate, performing the dials they are asked for. Memory: lowest VmRSS over ${(p.tenantSettleMs / 1000).toFixed(1)} s after each step; heap: nodejs_heap_size_used_bytes.`,
      `Fairness: A = ${p.tenantFloodConcurrency} dialling lanes (a load generator of their own) + ${p.tenantBulkFlows} downloads; the default tenant limits`,
      '(dial-rate 500/s, dial-burst 1000, max-pending-dials 1000, max-connections 10000); a `kanal agent` process per tenant and server;',
      "every process shares the backend and the machine's cores, hence the control run with A on a server of its own. The workers column:",
      "a `--workers 2` server of A and B, B's name picked so that rendezvous hashing (ownerOf) puts it in the other worker than A.",
      `Workers (7f): ${p.tenantWorkersTenants} tenants, each ${p.tenantWorkersLanes} dialling lanes and then ${p.tenantBulkFlows} downloads, all at once, each its own load generator`,
      `and \`kanal agent\` per server; dial-rate: 0 (off), other limits the defaults; names spread evenly over 2 workers (ownerOf).`,
      `--workers 1 runs one process, as a server without --workers; on ${os.availableParallelism()} cores every process of the run shares them.`,
      `Shared (7f, tenants.shared rows): one tenant with 7f's whole load (${p.tenantWorkersLanes * p.tenantWorkersTenants} lanes, then ${p.tenantBulkFlows * p.tenantWorkersTenants} downloads) through its own Unix socket,`,
      'on `--workers 2` with `tenant-workers: 1` (one worker serves it) and `2` (the primary binds its socket and steers each connection to a worker; its agent keeps a tunnel to each).',
    ],
  };
}
