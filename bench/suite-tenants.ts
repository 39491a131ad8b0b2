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
 * alone, and while A runs bulk downloads and a dial flood; A's refusals by
 * its dial-rate limit come from the server's /metrics.
 */
import fs from 'node:fs';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { loadCertificateAuthority } from '../kit/pki/certificate-authority.js';
import { issueAgentCertificate } from '../kit/pki/throwaway-pki.js';
import { freePort, loopbackServerArgs, waitHealthy } from '../kit/launch/kanal-cli.js';
import { spawnChild, type Child } from './children.js';
import { BACKEND_HOST, kanalProgram, readPem, startLoadgen, startSwarm } from './cluster.js';
import type { Env } from './env.js';
import type { ClientConfig, FloodResult, LoadgenCommands } from './loadgen-protocol.js';
import type { SwarmCommands } from './agent-swarm.js';
import type { Worker } from './rpc.js';
import { cpuSeconds, rssBytes } from './proc.js';
import type { TenantsReport, TenantsRow } from './report.js';
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
}

/** The files every tenant names: the wildcard serving pair and the agents' CA (one for all: SNI picks the tenant, the CA verifies). */
interface TenantCredentials {
  cert: string;
  key: string;
  ca: string;
}

const tenantName = (i: number): string => `t${String(i).padStart(4, '0')}`;
const serverName = (tenant: string): string => `${tenant}.${SNI_DOMAIN}`;

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
      `    uds-name: ${d.uds}`,
      '    delete-existing-uds-file: true',
      `    allowed-destination: [${d.allowed.join(', ')}]`,
      '    max-agents-per-credential: 1',
    );
  }
  return `${lines.join('\n')}\n`;
}

let writes = 0;

/** Replaces `file` in one rename (written beside its directory, so the server's watch sees one change). */
function writeTenantsFile(file: string, defs: readonly TenantDef[], c: TenantCredentials): void {
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

interface TenantsServer {
  child: Child;
  agentPort: number;
  healthUrl: string;
  log: LogTail;
}

async function startTenantsServer(env: Env, tag: string, file: string): Promise<TenantsServer> {
  const [agentPort, healthPort] = await Promise.all([freePort(), freePort()]);
  const logFile = path.join(env.dir, `${tag}-server.log`);
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
    ],
  });
  const healthUrl = `http://127.0.0.1:${healthPort}`;
  await waitHealthy(child, `${healthUrl}/healthz`, 60_000);
  return { child, agentPort, healthUrl, log: new LogTail(logFile) };
}

/** A `kanal agent` of one tenant: SNI names the tenant, its own certificate; it performs the server's dials. */
async function startTenantAgent(env: Env, tag: string, agentPort: number, tenant: string): Promise<Child> {
  const health = await freePort();
  const agentID = `${tag}-node`;
  const cred = await issueAgentCertificate(env.pki, agentID);
  const child = spawnChild({
    name: `${tag}-agent`,
    ...kanalProgram(env.kanalCli),
    logFile: path.join(env.dir, `${tag}-agent.log`),
    args: [
      'agent',
      '--proxy-server-host',
      '127.0.0.1',
      '--proxy-server-port',
      String(agentPort),
      '--tls-server-name',
      serverName(tenant),
      '--ca-cert',
      env.pki.caCert,
      '--agent-cert',
      cred.cert,
      '--agent-key',
      cred.key,
      '--agent-id',
      agentID,
      '--health-bind-address',
      '127.0.0.1',
      '--health-server-port',
      String(health),
      '--admin-server-port',
      '0',
      '--transport',
      env.transport,
      '--log-level',
      'info',
    ],
  });
  await waitHealthy(child, `http://127.0.0.1:${health}/readyz`, 30_000);
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
  let low = rssBytes(pid);
  const end = Date.now() + ms;
  while (Date.now() < end) {
    await sleep(Math.min(250, Math.max(1, end - Date.now())));
    low = Math.min(low, rssBytes(pid));
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
async function waitWorkersIdle(env: Env, workers: readonly Worker<LoadgenCommands>[], timeoutMs = 20_000): Promise<void> {
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

function failuresWarning(env: Env, what: string, r: { errors: number; firstError?: string }): void {
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
async function tenantClient(env: Env, name: string, uds: string): Promise<Worker<LoadgenCommands>> {
  const w = startLoadgen(env.dir, name);
  await w.call('configure', clientConfig(env, uds));
  return w;
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
    const deadline = Date.now() + 30_000;
    for (;;) {
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
      changedAgents: s.agentsPerTenant,
      runs: applied.length,
    },
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

/** Where tenant A's load goes: the server B is on, or a server of its own on the same machine (the control). */
type Phase = 'alone' | 'shared' | 'own';

const PHASES: readonly Phase[] = ['alone', 'shared', 'own'];

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
 * Tenant B alone, next to tenant A's load on the same server, and next to the
 * same load through a server of A's own on the same machine: what the shared
 * server costs B beyond the cores the two share.
 */
async function runFairness(env: Env, creds: TenantCredentials): Promise<TenantsRow[]> {
  const p = env.params;
  const dir = path.join(env.dir, 'tenants-fairness');
  fs.mkdirSync(dir, { recursive: true });
  const allowed = [`${BACKEND_HOST}:${env.ports.echoTcp}`];
  const [a, b] = ['a', 'b'].map((name) => ({ name, uds: path.join(dir, `${name}.sock`), allowed }));
  const soloA = { name: 'a', uds: path.join(dir, 'own-a.sock'), allowed };
  const sharedFile = path.join(dir, 'shared', 'tenants.yaml');
  const soloFile = path.join(dir, 'own', 'tenants.yaml');
  for (const f of [sharedFile, soloFile]) fs.mkdirSync(path.dirname(f), { recursive: true });
  writeTenantsFile(sharedFile, [a, b], creds);
  writeTenantsFile(soloFile, [soloA], creds);
  env.progress('tenants fairness: a server of tenants a and b, another of a alone, a kanal agent per tenant and server');
  const servers: TenantsServer[] = [];
  const children: Child[] = [];
  const workers: Worker<LoadgenCommands>[] = [];
  try {
    servers.push(
      ...(await Promise.all([startTenantsServer(env, 'tenants-fair', sharedFile), startTenantsServer(env, 'tenants-fair-own', soloFile)])),
    );
    const [shared, own] = servers;
    children.push(
      ...(await Promise.all([
        startTenantAgent(env, 'tenant-a', shared.agentPort, 'a'),
        startTenantAgent(env, 'tenant-b', shared.agentPort, 'b'),
        startTenantAgent(env, 'tenant-a-own', own.agentPort, 'a'),
      ])),
    );
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

    /** B's bulk download, one flow: MB/s over measureMs after warmupMs, counted by B's client alone. */
    const bBulk = async (): Promise<number> => {
      const group = `b${++groups}`;
      await clientB.call('openFlows', { group, path: 'kanal-cp', mode: 'down', count: 1, maxBytesPerFlow: maxBytes(1) }, 30_000);
      try {
        await sleep(p.warmupMs);
        const c0 = await clientB.call('counters', null);
        await sleep(p.measureMs);
        const c1 = await clientB.call('counters', null);
        const end = c1.t - c1.lastRxAt > 20 ? c1.lastRxAt : c1.t;
        return (c1.rx - c0.rx) / ((end - c0.t) / 1000) / 1e6;
      } finally {
        await clientB.call('stopFlows', { group });
      }
    };
    const bDials = async (into: number[][]): Promise<void> => {
      const r = await clientB.call('dials', { path: 'kanal-cp', n: p.tenantDials, concurrency: 1 }, 600_000);
      failuresWarning(env, "tenant B's dials", r);
      into.push(r.latenciesMs);
    };

    env.progress('tenants fairness: warm-up');
    await bDials([]);
    await bBulk();
    for (const uds of [a.uds, soloA.uds]) await floodA.call('dials', { path: 'kanal-cp', n: p.tenantDials, concurrency: 4, uds }, 600_000);
    await idleAll();

    const dials: Record<Phase, number[][]> = { alone: [], shared: [], own: [] };
    const bulk: Record<Phase, number[]> = { alone: [], shared: [], own: [] };
    const load = (): ALoad => ({ attempts: [], ok: [], refusedShare: [], mbps: [], rateRefused: 0, otherRefused: 0 });
    const aLoad: Record<'shared' | 'own', ALoad> = { shared: load(), own: load() };
    let bRefusals = 0;
    for (let rep = 0; rep < p.reps; rep++) {
      for (const phase of inRepOrder(PHASES, rep)) {
        const what = { alone: 'alone', shared: "next to A's load on its server", own: "next to A's load on A's own server" }[phase];
        env.progress(`tenants fairness: tenant B ${what}, run ${rep + 1}/${p.reps}`);
        const bBefore = await refusalsOf(shared, 'b');
        if (phase === 'alone') {
          await bDials(dials.alone);
          bulk.alone.push(await bBulk());
        } else {
          const server = phase === 'shared' ? shared : own;
          const uds = phase === 'shared' ? a.uds : soloA.uds;
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
        const bAfter = await refusalsOf(shared, 'b');
        bRefusals += Object.entries(bAfter).reduce((n, [reason, v]) => n + v - (bBefore[reason] ?? 0), 0);
        await idleAll();
      }
    }
    if (bRefusals > 0)
      env.warnings.push(`tenants fairness: tenant B had ${bRefusals} refusal(s) of its own (kanal_refusals_total{tenant="b"})`);
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
          ratioShared: at('shared') / at('alone'),
          ratioOwn: at('own') / at('alone'),
          sharedVsOwn: at('shared') / at('own'),
          aloneSpread: spread(dials.alone.map((x) => percentile(x, q))),
          sharedSpread: spread(dials.shared.map((x) => percentile(x, q))),
          samples: PHASES.reduce((n, phase) => n + pooled(dials[phase]).length, 0),
        },
        signed: ['aloneSpread', 'sharedSpread'],
      };
    };
    const loadRow = (phase: 'shared' | 'own'): TenantsRow => {
      const l = aLoad[phase];
      return {
        id: `tenants.fairness.a-load${phase === 'own' ? '.own-server' : ''}`,
        table: 'load',
        label: phase === 'shared' ? "A on B's server" : 'A on its own server',
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
          ratioShared: medianRatio(bulk.shared, bulk.alone),
          ratioOwn: medianRatio(bulk.own, bulk.alone),
          sharedVsOwn: medianRatio(bulk.shared, bulk.own),
          aloneSpread: spread(bulk.alone),
          sharedSpread: spread(bulk.shared),
          samples: PHASES.reduce((n, phase) => n + bulk[phase].length, 0),
        },
        signed: ['aloneSpread', 'sharedSpread'],
        runs: PHASES.flatMap((phase) => bulk[phase]).map((x) => Math.round(x)),
      },
      loadRow('shared'),
      loadRow('own'),
    ];
  } finally {
    await Promise.all([...workers.map((w) => w.child.stop()), ...children.map((c) => c.stop())]);
    await Promise.all(servers.map((s) => s.child.stop()));
  }
}

export async function runTenants(env: Env): Promise<TenantsReport> {
  const p = env.params;
  const creds = await tenantCredentials(env);
  const rows: TenantsRow[] = [];
  for (const s of [
    { tenants: p.tenantsMany, agentsPerTenant: p.tenantsManyAgents },
    { tenants: p.tenantsFew, agentsPerTenant: p.tenantsFewAgents },
  ]) {
    rows.push(...(await runScale(env, s, creds)));
  }
  rows.push(...(await runFairness(env, creds)));
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
      "every process shares the backend and the machine's cores, hence the control run with A on a server of its own.",
    ],
  };
}
