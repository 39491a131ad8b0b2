/**
 * `kanal server --tenants-config --workers 2` (docs/multi-tenant.md,
 * "Workers") under what a peer, a supervisor or a crash does to it:
 *
 * - agents of a token tenant that connect by IP address (no SNI, Go's agent's
 *   default) every one reach their tenant's worker, none refused on the worker
 *   that does not serve it; `/readyz?tenant=` answers as a single process;
 * - SIGTERM with agents connected: the primary stops its workers first and
 *   exits 0 by itself (no worker killed), its private directory removed;
 * - SIGKILL of the primary leaves its directory; the next start removes it,
 *   and nothing else: not another user's, not a symlink, not a directory of
 *   another mode;
 * - connections that never finish their ClientHello are held at most
 *   --max-pending-client-hellos-per-host per address (and in all), the rest
 *   closed and counted, while an honest agent connects;
 * - a tenant of `tenant-workers: 2` is a server of its own on both workers: its
 *   agent holds a tunnel to each, its kube-apiserver's dials (TCP frontend and
 *   its own Unix socket, which the primary binds) land on both, each worker's
 *   series of it apart, and a change of `tenant-workers` moves it, its socket
 *   bound by the one worker that serves it then.
 */
import test, { type ExecutionContext } from 'ava';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { freePort, spawnKanal, waitHealthy, withPortRetry } from '../../kit/launch/kanal-cli.js';
import type { Child } from '../../kit/launch/child.js';
import { connectUnix, httpConnect } from '../../kit/demo/proxy-client.js';
import {
  echoRoundTrip,
  httpGet,
  makeWorkspace,
  runCli,
  scrapeMetrics,
  startAgent,
  startEchoBackend,
  tlsToFrontend,
  waitUntil,
  type Workspace,
} from '../helpers/kanal-processes.js';
import { shippedRbac, startKubeApi, type KubeFixture } from '../helpers/kube-stand-in/fixture.js';
import { tcpFrontendArgs, tenantsFile, tenantsServerArgs } from '../helpers/tenants.js';
import { ownerOf, ownersOf } from '../../src/server/workers/owner.js';
import { WORKER_STOP_GRACE_MS } from '../../src/server/workers/primary.js';

const NS = 'kube-system';
const SA = 'konnectivity-agent';
const AUDIENCE = 'system:konnectivity-server';
/** A certificate tenant and a token tenant, one in each worker. */
const CERT_TENANT = 'alpha';
const TOKEN_TENANT = 'beta';

interface WorkersServer extends Child {
  agentPort: number;
  healthPort: number;
}

function alphaEntry(ws: Workspace, echo?: string): string {
  return `  - name: ${CERT_TENANT}
    cluster-ca-cert: ${ws.pki.caCert}
    uds-name: ${path.join(ws.dir, `${CERT_TENANT}.sock`)}
${echo ? `    allowed-destination: [${echo}]\n` : ''}`;
}

async function startWorkers(
  t: ExecutionContext,
  ws: Workspace,
  entries: string[],
  name: string,
  extraArgs: string[] = [],
  /** The temporary directory its primary makes its private directory in (TMPDIR); default the machine's. */
  tmp?: string,
): Promise<WorkersServer> {
  const file = path.join(ws.dir, `${name}.yaml`);
  fs.writeFileSync(file, tenantsFile(entries));
  return withPortRetry(async () => {
    const [agentPort, healthPort] = [await freePort(), await freePort()];
    const args = [
      ...tenantsServerArgs({
        file,
        defaultPair: { cert: ws.pki.serverCert, key: ws.pki.serverKey },
        agentHost: '127.0.0.1',
        agentPort,
        healthPort,
      }),
      '--workers',
      '2',
      ...extraArgs,
    ];
    const proc = spawnKanal(t, {
      name,
      args: [...args, '--server-id', name],
      logFile: path.join(ws.dir, `${name}.log`),
      ...(tmp ? { env: { ...process.env, TMPDIR: tmp } } : {}),
    });
    await waitHealthy(proc, `http://127.0.0.1:${healthPort}/readyz`, 30_000);
    return Object.assign(proc, { agentPort, healthPort });
  });
}

/** The primary's private directories in `tmp` (named with its pid, private-dir.ts). */
function dirsOf(pid: number, tmp: string): string[] {
  return fs
    .readdirSync(tmp)
    .filter((n) => n.startsWith(`kanal-workers-${pid}-`))
    .map((n) => path.join(tmp, n));
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

function workerPids(server: Child): number[] {
  return server
    .jsonLines()
    .filter((l) => l.msg === 'worker ready')
    .map((l) => Number(l.pid));
}

test.serial("token agents without SNI all reach their tenant's worker; /readyz?tenant= answers as one process does", async (t) => {
  t.is(ownerOf(CERT_TENANT, 2), 0);
  t.is(ownerOf(TOKEN_TENANT, 2), 1, 'the token tenant lives in worker 1: half of the round-robin lands in the other');
  const ws = await makeWorkspace(t, 'kanal-workers-');
  const echo = await startEchoBackend(t);
  const k: KubeFixture = await startKubeApi(t, { rbac: await shippedRbac() });
  const kubeconfig = await k.api.writeKubeconfig(path.join(ws.dir, 'beta.kubeconfig'), {
    user: 'system:konnectivity-server',
    auth: 'certificate',
  });
  const token = (pod: string): string => {
    const jwt = k.api.tokens.issueServiceAccountToken({
      namespace: NS,
      serviceAccount: SA,
      audiences: [AUDIENCE],
      pod: { name: pod },
      node: { name: `node-of-${pod}` },
    });
    const file = path.join(ws.dir, `${pod}.token`);
    fs.writeFileSync(file, jwt);
    return file;
  };
  const probe = fs.readFileSync(token('probe'), 'utf8');
  const iss = String((JSON.parse(Buffer.from(probe.split('.')[1], 'base64url').toString('utf8')) as { iss?: unknown }).iss);
  const beta = `  - name: ${TOKEN_TENANT}
    server-name: [beta.workers.test]
    cluster-cert: ${ws.pki.serverCert}
    cluster-key: ${ws.pki.serverKey}
    agent-namespace: ${NS}
    agent-service-account: ${SA}
    authentication-audience: ${AUDIENCE}
    kubeconfig: ${kubeconfig}
    token-issuer: ${iss}
    uds-name: ${path.join(ws.dir, `${TOKEN_TENANT}.sock`)}
    allowed-destination: [${echo.address}]
`;
  const server = await startWorkers(t, ws, [alphaEntry(ws), beta], 'tokens');

  // Before any agent: an unknown tenant is 503 and named as such; the listing of workers is not what it gets.
  const nosuch = await httpGet(`http://127.0.0.1:${server.healthPort}/readyz?tenant=nosuch`);
  t.is(nosuch.status, 503, nosuch.body);
  t.regex(nosuch.body, /no tenant "nosuch" here/);
  t.notRegex(nosuch.body, /pid|worker/);

  // Agents connect one after another, so the primary's round-robin alternates between the workers.
  const N = 6;
  for (let i = 1; i <= N; i++)
    await startAgent(t, ws, server, {
      agentID: `beta-node-${i}`,
      cert: 'none',
      extraArgs: ['--service-account-token-path', token(`beta-node-${i}`)],
    });
  const m = await scrapeMetrics(server.healthPort);
  t.is(m.get(`kanal_server_agents{tenant="${TOKEN_TENANT}"}`), N, 'every token agent is in its tenant');
  const refusedStreams = [...m].filter(([k]) => k.startsWith('kanal_refusals_total{') && k.includes('reason="agent_tenant_unknown"'));
  const relayed = server
    .jsonLines()
    .filter((l) => l.msg === "agent connection relayed to its token's tenant" && l.worker === 0 && l.tenant === TOKEN_TENANT);
  t.true(relayed.length > 0, 'the worker without the tenant received some of them, and relayed each');
  t.deepEqual(
    refusedStreams.filter(([, v]) => v > 0),
    [],
    'no stream reached a worker without its tenant',
  );
  t.false(
    server.jsonLines().some((l) => /no longer served/.test(String(l.reason))),
    'no agent was told its tenant is not served',
  );
  t.true(
    server.jsonLines().some((l) => l.msg === 'agent connected' && l.tenant === TOKEN_TENANT && l.worker === 1),
    "the token tenant's agents are served by its own worker",
  );
  const s = await httpConnect(await connectUnix(path.join(ws.dir, `${TOKEN_TENANT}.sock`)), echo.address, 10_000);
  t.true(await echoRoundTrip(s, Buffer.from('through a token agent that came without SNI')));
  s.destroy();

  // A known tenant: its own readiness (from its worker, polled), as a single process answers it.
  await waitUntil(
    async () => (await httpGet(`http://127.0.0.1:${server.healthPort}/readyz?tenant=${TOKEN_TENANT}`)).status === 200,
    'the token tenant ready',
    10_000,
  );
  const ready = await httpGet(`http://127.0.0.1:${server.healthPort}/readyz?tenant=${TOKEN_TENANT}`);
  t.regex(ready.body, new RegExp(`^ok: tenant ${TOKEN_TENANT}: `));
  const idle = await httpGet(`http://127.0.0.1:${server.healthPort}/readyz?tenant=${CERT_TENANT}`);
  t.is(idle.status, 503, 'a tenant without agents is not ready, as in one process');
  t.regex(idle.body, new RegExp(`^not ready: tenant ${CERT_TENANT}: `));
});

test.serial(
  'SIGTERM with an agent connected: workers stopped first, exit 0 by itself, its directory removed; after SIGKILL the next start removes only what is provably a dead primary’s',
  async (t) => {
    const ws = await makeWorkspace(t, 'kanal-workers-');
    // A temporary directory of this test's own: another suite's primary starting meanwhile removes a dead primary's directory from the machine's.
    const tmp = path.join(ws.dir, 'tmp');
    fs.mkdirSync(tmp, { mode: 0o700 });
    const echo = await startEchoBackend(t);
    const first = await startWorkers(t, ws, [alphaEntry(ws, echo.address)], 'first', [], tmp);
    const [dir] = dirsOf(first.pid, tmp);
    t.truthy(dir, 'the primary has its private directory');
    t.is(fs.statSync(dir).mode & 0o777, 0o700);
    // No SNI and a certificate: it may reach the worker without the tenant and be relayed (the case a close used to wait on).
    await startAgent(t, ws, first, { agentID: 'node-1' });
    await startAgent(t, ws, first, { agentID: 'node-2' });
    const s = await httpConnect(await connectUnix(path.join(ws.dir, `${CERT_TENANT}.sock`)), echo.address, 10_000);
    t.true(await echoRoundTrip(s, Buffer.from('open while the server stops')));
    const workers = workerPids(first);
    t.is(workers.length, 2);

    first.signal('SIGTERM');
    // Bounded by the workers' grace and a margin; failing it means the primary hung.
    const exit = await Promise.race([
      first.exited,
      new Promise<'hung'>((resolve) => setTimeout(() => resolve('hung'), WORKER_STOP_GRACE_MS + 15_000).unref()),
    ]);
    s.destroy();
    t.deepEqual(exit, { code: 0, signal: null }, `the primary exits 0 by itself: ${first.tail(10)}`);
    t.false(
      first.jsonLines().some((l) => l.msg === 'worker did not stop in time: killed'),
      'each worker stopped by itself, its agents drained',
    );
    t.true(
      first.jsonLines().some((l) => l.msg === 'kanal server stopped' && l.worker === 0),
      'worker 0 went through its own stop',
    );
    t.false(fs.existsSync(dir), 'the private directory is removed');
    await waitUntil(() => workers.every((p) => !alive(p)), 'the workers gone', 10_000);

    // SIGKILL: nothing of the primary runs to clean up.
    const second = await startWorkers(t, ws, [alphaEntry(ws)], 'second', [], tmp);
    const [stale] = dirsOf(second.pid, tmp);
    t.truthy(stale);
    const secondWorkers = workerPids(second);
    await second.kill();
    await waitUntil(() => secondWorkers.every((p) => !alive(p)), "the killed primary's workers stop by themselves", 10_000);
    t.true(fs.existsSync(stale), 'SIGKILL leaves the directory');

    // Look-alikes of a dead primary's directory that are not provably its: kept.
    const dead = second.pid;
    const planted: string[] = [];
    const plant = (suffix: string, make: (p: string) => void): string => {
      const p = path.join(tmp, `kanal-workers-${dead}-${suffix}`);
      make(p);
      planted.push(p);
      return p;
    };
    t.teardown(() => {
      for (const p of planted) fs.rmSync(p, { recursive: true, force: true });
    });
    const target = path.join(ws.dir, 'not-yours');
    fs.mkdirSync(target, { mode: 0o700 });
    fs.writeFileSync(path.join(target, 'keep'), 'x');
    const link = plant('symlnk', (p) => fs.symlinkSync(target, p));
    const wide = plant('widemd', (p) => {
      fs.mkdirSync(p);
      fs.chmodSync(p, 0o755);
    });
    let others: string | undefined;
    if (process.getuid?.() === 0) {
      others = plant('nobody', (p) => {
        fs.mkdirSync(p, { mode: 0o700 });
        fs.chownSync(p, 65534, 65534);
      });
    } else t.log("not root: the other user's directory is not planted");

    const third = await startWorkers(t, ws, [alphaEntry(ws)], 'third', [], tmp);
    await third.waitForLine((l) => l.msg === 'kanal server started with workers', 10_000, 'the third primary started');
    t.false(fs.existsSync(stale), "the next start removed the killed primary's directory");
    t.true(fs.lstatSync(link).isSymbolicLink(), 'a symlink is not removed');
    t.true(fs.existsSync(path.join(target, 'keep')), 'nor followed');
    t.true(fs.existsSync(wide), 'a directory of another mode is kept');
    if (others) t.true(fs.existsSync(others), "another user's directory is kept");
    t.is(dirsOf(third.pid, tmp).length, 1, 'the third has its own');
  },
);

/** Opens `n` connections from `localAddress` that send one byte of a ClientHello and nothing more; resolves once each is either held (still open after the server read it) or closed by the server. */
async function halfHellos(t: ExecutionContext, port: number, localAddress: string, n: number): Promise<net.Socket[]> {
  const sockets: net.Socket[] = [];
  t.teardown(() => {
    for (const s of sockets) s.destroy();
  });
  for (let i = 0; i < n; i++) {
    const s = net.connect({ host: '127.0.0.1', port, localAddress });
    s.on('error', () => undefined);
    await new Promise<void>((resolve) => {
      s.once('connect', () => resolve());
      s.once('close', () => resolve());
    });
    s.write(Buffer.from([0x16]));
    sockets.push(s);
  }
  return sockets;
}

test.serial(
  'connections that never finish their ClientHello are capped per address and in all, counted, and an honest agent connects',
  async (t) => {
    const ws = await makeWorkspace(t, 'kanal-workers-');
    const PER_HOST = 8;
    const TOTAL = 20;
    const server = await startWorkers(t, ws, [alphaEntry(ws)], 'hellos', [
      '--max-pending-client-hellos',
      String(TOTAL),
      '--max-pending-client-hellos-per-host',
      String(PER_HOST),
    ]);
    const refused = async (): Promise<number> =>
      (await scrapeMetrics(server.healthPort)).get('kanal_refusals_total{reason="client_hello_backlog",worker="primary"}') ?? 0;
    const open = (list: net.Socket[]): number => list.filter((s) => !s.destroyed && s.readyState === 'open').length;

    // Three hosts flood back to back (well within the 15 s a held connection may wait): 8 + 8 held, then 4 more fill the total.
    const a = await halfHellos(t, server.agentPort, '127.0.0.2', 30);
    const b = await halfHellos(t, server.agentPort, '127.0.0.3', 30);
    const c = await halfHellos(t, server.agentPort, '127.0.0.4', 30);
    await waitUntil(async () => (await refused()) === 3 * 30 - TOTAL, 'every connection beyond the bounds refused and counted', 10_000);
    await waitUntil(() => open(a) + open(b) + open(c) === TOTAL, 'the server closed the ones it refused', 10_000);
    t.is(open(a), PER_HOST, 'one host holds its share, no more');
    t.is(open(b), PER_HOST);
    t.is(open(c), TOTAL - 2 * PER_HOST, 'the last host got what the total left');

    // The third host gives up; the other two keep holding their share: an honest agent from another address connects.
    for (const s of c) s.destroy();
    const honest = await startAgent(t, ws, server, { agentID: 'honest' });
    t.is((await httpGet(honest.readyzUrl())).status, 200);
    const line = server.jsonLines().find((l) => l.refusal === 'client_hello_backlog');
    t.regex(String(line?.msg), /--max-pending-client-hellos/);
    t.true(honest.running(), 'the honest agent is unharmed');
  },
);

test('--workers with --audit-log-path: the primary names the files its workers write; `kanal status` against it names --workers as why there is no status', async (t) => {
  const ws = await makeWorkspace(t, 'kanal-workers-');
  const audit = path.join(ws.dir, 'audit.log');
  // freePort() races other test files, and startWorkers keeps extra ports across its retries: a start that dies of EADDRINUSE starts again on a fresh one.
  const { server, adminPort } = await withPortRetry(async () => {
    const adminPort = await freePort();
    const server = await startWorkers(t, ws, [alphaEntry(ws)], 'newcomer', ['--admin-port', String(adminPort), '--audit-log-path', audit]);
    return { server, adminPort };
  });
  const line = await server.waitForLog(
    (l) => typeof l.msg === 'string' && l.msg.startsWith('--audit-log-path with --workers'),
    10_000,
    'the line naming the audit files',
  );
  t.deepEqual(line.files, [path.join(ws.dir, 'audit.worker-0.log'), path.join(ws.dir, 'audit.worker-1.log')]);
  t.regex(String(line.msg), /nothing is written to .*audit\.log$/);
  const r = await runCli(['status', '--admin-address', `127.0.0.1:${adminPort}`]);
  t.is(r.code, 1, r.stdout);
  t.regex(r.stderr, /serves no status: this is the primary of --workers 2: the agents are held by its workers/);
});

/** `p`, its failure named by `what` (which of several like steps failed). */
async function step<T>(what: string, p: Promise<T>): Promise<T> {
  try {
    return await p;
  } catch (err) {
    throw new Error(`${what}: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
  }
}

test.serial(
  "a tenant of tenant-workers: 2 is served by both: its agent holds a tunnel to each, its kube-apiserver's dials land on both; tenant-workers: 1 again moves it back to one",
  async (t) => {
    t.timeout(120_000);
    const ws = await makeWorkspace(t, 'kanal-workers-');
    const echo = await startEchoBackend(t);
    t.deepEqual(ownersOf(CERT_TENANT, 2, 2), [0, 1], 'alpha: worker 0 first, the one that serves it alone');
    const entry = (workers: number): string => `  - name: ${CERT_TENANT}
    server-name: [localhost]
    cluster-cert: ${ws.pki.serverCert}
    cluster-key: ${ws.pki.serverKey}
    cluster-ca-cert: ${ws.pki.caCert}
    server-ca-cert: ${ws.pki.frontendCaCert}
    uds-name: ${path.join(ws.dir, `${CERT_TENANT}.sock`)}
    tenant-workers: ${workers}
`;
    // freePort() races other test files, and startWorkers keeps extra ports across its retries: a start that dies of EADDRINUSE starts again on a fresh one.
    const { server, frontendPort } = await withPortRetry(async () => {
      const frontendPort = await freePort();
      const server = await startWorkers(t, ws, [entry(2)], 'spread', [
        ...tcpFrontendArgs(frontendPort, { cert: ws.pki.frontendCert, key: ws.pki.frontendKey }),
      ]);
      return { server, frontendPort };
    });
    // Its server name: the primary places each connection in the tenant and steers it over the tenant's workers.
    const agent = await startAgent(t, ws, server, { agentID: 'node-1', extraArgs: ['--tls-server-name', 'localhost'] });
    const detail = async (): Promise<string> => (await httpGet(agent.readyzUrl()).catch(() => ({ body: '' }))).body;
    await waitUntil(async () => /2\/2 server tunnel\(s\) up/.test(await detail()), 'the agent holds a tunnel to each worker', 20_000);
    t.regex(await detail(), /spread-w0/);
    t.regex(await detail(), /spread-w1/);
    const agentsOn = async (w: number): Promise<number> =>
      (await scrapeMetrics(server.healthPort)).get(`kanal_server_agents{tenant="${CERT_TENANT}",worker="${w}"}`) ?? 0;
    await waitUntil(async () => (await agentsOn(0)) === 1 && (await agentsOn(1)) === 1, "each worker holds alpha's agent", 10_000);
    t.false(
      server.jsonLines().some((l) => l.msg === "agent connection relayed to its token's tenant" || l.msg === 'relayed connection'),
      'no connection was relayed between workers',
    );

    // The kube-apiserver's CONNECTs on the shared TCP frontend: served by both workers, each with the agent at hand.
    for (let i = 0; i < 12; i++) {
      const s = await step(
        `CONNECT ${i} on the TCP frontend`,
        httpConnect(await tlsToFrontend({ frontendPort }, ws), echo.address, 10_000),
      );
      t.true(await echoRoundTrip(s, Buffer.from(`CONNECT ${i} through a tenant on two workers`)), `CONNECT ${i}`);
      s.destroy();
    }
    const dialsOn = async (w: number): Promise<number> =>
      [...(await scrapeMetrics(server.healthPort))]
        .filter(([k]) => k.startsWith('kanal_dials_total{') && k.includes('result="ok"') && k.includes(`worker="${w}"`))
        .reduce((n, [, v]) => n + v, 0);
    const dials = [await dialsOn(0), await dialsOn(1)];
    t.is(dials[0] + dials[1], 12, `dials per worker: ${dials.join(', ')}`);
    t.true(
      dials.every((n) => n > 0),
      `both workers served alpha's dials: ${dials.join(', ')}`,
    );
    // Its own Unix socket is one file, bound by the primary: its connections land on both workers too.
    const sock = path.join(ws.dir, `${CERT_TENANT}.sock`);
    for (let i = 0; i < 8; i++) {
      const viaUds = await step(`CONNECT ${i} on the tenant's Unix socket`, httpConnect(await connectUnix(sock), echo.address, 10_000));
      t.true(await echoRoundTrip(viaUds, Buffer.from(`CONNECT ${i} through the Unix socket of a shared tenant`)));
      viaUds.destroy();
    }
    const viaUdsDials = [(await dialsOn(0)) - dials[0], (await dialsOn(1)) - dials[1]];
    t.is(viaUdsDials[0] + viaUdsDials[1], 8, `dials per worker through the Unix socket: ${viaUdsDials.join(', ')}`);
    t.true(
      viaUdsDials.every((n) => n > 0),
      `both workers served the Unix socket's dials: ${viaUdsDials.join(', ')}`,
    );
    t.true(
      server
        .jsonLines()
        .some(
          (l) => l.msg === "tenant's Unix socket ready, its connections spread over the workers that share it" && l.tenant === CERT_TENANT,
        ),
      'the primary bound it',
    );
    // Polled from its workers every 2 s: ready once one of them says so.
    await waitUntil(
      async () => (await httpGet(`http://127.0.0.1:${server.healthPort}/readyz?tenant=${CERT_TENANT}`)).status === 200,
      'the shared tenant ready',
      10_000,
    );

    // Back to one worker: the second closes its room, the first serves it alone under the server's own ID.
    const applied = (w: number): number => server.jsonLines().filter((l) => l.msg === 'tenants file applied' && l.worker === w).length;
    const before = [applied(0), applied(1)];
    fs.writeFileSync(path.join(ws.dir, 'spread.yaml'), tenantsFile([entry(1)]));
    server.signal('SIGHUP');
    // Each worker applies the file on its own: until both have, a connection may still meet the old placement.
    await waitUntil(() => applied(0) > before[0] && applied(1) > before[1], 'both workers applied the file', 30_000);
    await waitUntil(async () => /1\/1 server tunnel\(s\) up/.test(await detail()), 'the agent holds one tunnel', 30_000);
    t.notRegex(await detail(), /spread-w/);
    await waitUntil(
      async () => (await scrapeMetrics(server.healthPort)).get(`kanal_server_agents{tenant="${CERT_TENANT}"}`) === 1,
      'one worker serves alpha, its series without a worker label again',
      10_000,
    );
    const again = await step('CONNECT after the change', httpConnect(await tlsToFrontend({ frontendPort }, ws), echo.address, 10_000));
    t.true(await echoRoundTrip(again, Buffer.from('served whole by one worker')));
    again.destroy();
    // The primary let go of its socket, and the one worker that serves it now bound it.
    const udsAgain = await step(
      "CONNECT on the tenant's Unix socket after the change",
      waitUntil(() => fs.existsSync(sock), 'the socket bound again', 10_000).then(async () =>
        httpConnect(await connectUnix(sock), echo.address, 10_000),
      ),
    );
    t.true(await echoRoundTrip(udsAgain, Buffer.from('its own socket, served whole by one worker')));
    udsAgain.destroy();

    // And shared again: the worker lets go of the socket, the primary binds it once every worker has applied the file.
    const ready = (): number =>
      server.jsonLines().filter((l) => l.msg === "tenant's Unix socket ready, its connections spread over the workers that share it")
        .length;
    const [beforeShared, readyBefore] = [[applied(0), applied(1)], ready()];
    fs.writeFileSync(path.join(ws.dir, 'spread.yaml'), tenantsFile([entry(2)]));
    server.signal('SIGHUP');
    await waitUntil(() => applied(0) > beforeShared[0] && applied(1) > beforeShared[1], 'both workers applied the file again', 30_000);
    await waitUntil(() => ready() > readyBefore, 'the primary bound the socket again', 10_000);
    const shared = await step(
      "CONNECT on the tenant's Unix socket, shared again",
      httpConnect(await connectUnix(sock), echo.address, 10_000),
    );
    t.true(await echoRoundTrip(shared, Buffer.from('its socket bound by the primary again')));
    shared.destroy();
  },
);
