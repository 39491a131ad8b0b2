/**
 * One `kanal server` for several clusters (docs/multi-tenant.md), with real
 * processes and TLS on loopback: tenant alpha's agents are recognised by
 * server name (SNI) and its kube-apiserver comes in on its own Unix socket;
 * tenant beta's agents by their client certificate's CA and subject, its
 * kube-apiserver on the shared mTLS TCP frontend by its certificate. Every
 * attempt to cross from one tenant to the other is refused, logged with both
 * named and counted, and the other tenant's traffic goes on; the file is
 * changed live (an invalid file changes nothing, a removed tenant is closed).
 */
import test, { type ExecutionContext } from 'ava';
import fs from 'node:fs/promises';
import path from 'node:path';
import { readFileSync } from 'node:fs';
import { createCertificateAuthority, type CertificateAuthority } from '../../kit/pki/certificate-authority.js';
import { freePort, spawnKanal, waitHealthy, withPortRetry } from '../../kit/launch/kanal-cli.js';
import type { Child } from '../../kit/launch/child.js';
import { connectUnix, httpConnect, ConnectRefused } from '../../kit/demo/proxy-client.js';
import {
  echoRoundTrip,
  makeWorkspace,
  readHashed,
  runCli,
  scrapeMetrics,
  sha256,
  startAgent,
  startEchoBackend,
  startSourceBackend,
  tlsToFrontend,
  type KanalAgentProcess,
  type Workspace,
} from '../helpers/kanal-processes.js';
import { tcpFrontendArgs, tenantsFile, tenantsServerArgs, writePair, type Pem } from '../helpers/tenants.js';
import { roundRobin } from '../helpers/round-robin.js';
import { ProxyStream } from '../helpers/e2e-grpc-client.js';
import * as grpc from '@grpc/grpc-js';
import { setTimeout as sleep } from 'node:timers/promises';

const ALPHA_NAME = 'alpha.tenants.test';

/** Files of both tenants' credentials: each has its own CAs, as two clusters do. */
interface TenantPki {
  alphaAgentCa: string;
  alphaServing: Pem & { ca: string };
  alphaAgent: (id: string) => Promise<Pem>;
  betaAgentCa: string;
  betaAgent: (id: string) => Promise<Pem>;
  betaKasCa: string;
  betaKas: Pem;
  /** A kube-apiserver certificate of alpha that beta's KAS CA happens to sign: beta's pins tell them apart. */
  alphaKas: Pem;
}

async function tenantPki(ws: Workspace): Promise<TenantPki> {
  const dir = path.join(ws.dir, 'tenants-pki');
  await fs.mkdir(dir);
  const ca = async (name: string): Promise<[CertificateAuthority, string]> => {
    const c = await createCertificateAuthority(name);
    const file = path.join(dir, `${name}.crt`);
    await fs.writeFile(file, c.certPem);
    return [c, file];
  };
  const [[alphaAgents, alphaAgentCa], [alphaServingCa, alphaServingCaFile], [betaAgents, betaAgentCa], [betaKasCa, betaKasCaFile]] =
    await Promise.all([ca('alpha-agents-ca'), ca('alpha-serving-ca'), ca('beta-agents-ca'), ca('beta-kas-ca')]);
  const alphaServing = await writePair(
    dir,
    'alpha-serving',
    await alphaServingCa.issue({ commonName: ALPHA_NAME, dnsNames: [ALPHA_NAME], usage: 'server' }),
  );
  const betaKas = await writePair(dir, 'beta-kas', await betaKasCa.issue({ commonName: 'beta-kube-apiserver', usage: 'client' }));
  const alphaKas = await writePair(dir, 'alpha-kas', await betaKasCa.issue({ commonName: 'alpha-kube-apiserver', usage: 'client' }));
  return {
    alphaAgentCa,
    alphaServing: { ...alphaServing, ca: alphaServingCaFile },
    alphaAgent: async (id) => writePair(dir, `alpha-${id}`, await alphaAgents.issue({ commonName: id, usage: 'client' })),
    betaAgentCa,
    betaAgent: async (id) => writePair(dir, `beta-${id}`, await betaAgents.issue({ commonName: `system:node:${id}`, usage: 'client' })),
    betaKasCa: betaKasCaFile,
    betaKas,
    alphaKas,
  };
}

function tenantsYaml(ws: Workspace, p: TenantPki, tenants: ('alpha' | 'beta')[], backend: string): string {
  const alpha = `  - name: alpha
    server-name: [${ALPHA_NAME}]
    cluster-cert: ${p.alphaServing.cert}
    cluster-key: ${p.alphaServing.key}
    cluster-ca-cert: ${p.alphaAgentCa}
    uds-name: ${path.join(ws.dir, 'alpha.sock')}
    allowed-destination: [${backend}]
`;
  const beta = `  - name: beta
    cluster-ca-cert: ${p.betaAgentCa}
    agent-client-subject: [CN=system:node:*]
    server-ca-cert: ${p.betaKasCa}
    frontend-client-subject: [CN=beta-kube-apiserver]
    proxy-strategies: destHost,default
`;
  return tenantsFile([...(tenants.includes('alpha') ? [alpha] : []), ...(tenants.includes('beta') ? [beta] : [])]);
}

interface TenantsServer extends Child {
  agentPort: number;
  healthPort: number;
  frontendPort: number;
  file: string;
}

async function startTenantsServer(
  t: ExecutionContext,
  ws: Workspace,
  yaml: string,
  extraArgs: string[] = [],
  name = 'shared-server',
): Promise<TenantsServer> {
  const file = path.join(ws.dir, `${name}.yaml`);
  await fs.writeFile(file, yaml);
  const { pki } = ws;
  return withPortRetry(async () => {
    const [agentPort, healthPort, frontendPort] = [await freePort(), await freePort(), await freePort()];
    const args = [
      ...tenantsServerArgs({
        file,
        defaultPair: { cert: pki.serverCert, key: pki.serverKey },
        agentHost: '127.0.0.1',
        agentPort,
        healthPort,
      }),
      ...tcpFrontendArgs(frontendPort, { cert: pki.frontendCert, key: pki.frontendKey }),
      ...extraArgs,
    ];
    const proc = spawnKanal(t, { name, args: [...args, '--server-id', name], logFile: path.join(ws.dir, `${name}.log`) });
    // Generous: with --workers a start is three processes, on a machine other suites keep busy.
    await waitHealthy(proc, `http://127.0.0.1:${healthPort}/readyz`, 60_000);
    return Object.assign(proc, { agentPort, healthPort, frontendPort, file });
  });
}

/** A Kanal agent of alpha: its own certificate, the tenant's server name as SNI. */
async function alphaAgent(
  t: ExecutionContext,
  ws: Workspace,
  server: TenantsServer,
  p: TenantPki,
  id: string,
  waitReady = true,
  extraArgs: string[] = [],
): Promise<KanalAgentProcess> {
  const cred = await p.alphaAgent(id);
  return startAgent(t, ws, server, {
    agentID: id,
    cert: 'none',
    waitReady,
    extraArgs: [
      '--ca-cert',
      p.alphaServing.ca,
      '--tls-server-name',
      ALPHA_NAME,
      '--agent-cert',
      cred.cert,
      '--agent-key',
      cred.key,
      ...extraArgs,
    ],
  });
}

/** A Kanal agent of beta: no SNI (an IP address), recognised by its certificate; the default certificate is the workspace's. `agentPort`: a server's, or a balancer's in front of several. */
async function betaAgent(t: ExecutionContext, ws: Workspace, agentPort: number, p: TenantPki, id: string): Promise<KanalAgentProcess> {
  const own = await p.betaAgent(id);
  return startAgent(t, ws, { agentPort }, { agentID: id, cert: 'none', extraArgs: ['--agent-cert', own.cert, '--agent-key', own.key] });
}

/** CONNECT on alpha's socket to `address`. */
async function viaAlpha(ws: Workspace, address: string): Promise<import('node:net').Socket> {
  return httpConnect(await connectUnix(path.join(ws.dir, 'alpha.sock')), address, 30_000);
}

/** CONNECT on the shared TCP frontend with `cred` as the kube-apiserver's certificate. */
async function viaFrontend(ws: Workspace, server: TenantsServer, cred: Pem, address: string): Promise<import('node:net').Socket> {
  const s = await tlsToFrontend(server, ws, { credential: cred, servername: 'localhost' });
  // A connection the server refuses after the handshake (TLS 1.3 checks the client's certificate then) is closed without an answer.
  const closed = new Promise<never>((_, reject) => s.once('close', () => reject(new ConnectRefused(-2, 'closed without an answer'))));
  return Promise.race([httpConnect(s, address, 30_000), closed]);
}

/** One round trip through the socket `open` gives; a failure to open says which step (`what`) it was. */
async function echoes(open: Promise<import('node:net').Socket>, what: string): Promise<boolean> {
  const s = await open.catch((err: unknown) => {
    throw new Error(`${what}: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
  });
  try {
    return await echoRoundTrip(s, Buffer.from(what));
  } finally {
    s.destroy();
  }
}

/** The status a refused CONNECT got (0 when it was not refused, or failed otherwise). */
async function refusedWith(open: Promise<import('node:net').Socket>): Promise<number> {
  try {
    (await open).destroy();
    return 0;
  } catch (err) {
    return err instanceof ConnectRefused ? err.status : -1;
  }
}

/** The server's refusal line for `reason`, within a few seconds. */
function refusal(server: TenantsServer, reason: string): Promise<Record<string, unknown>> {
  return server.waitForLine((o) => o.refusal === reason, 10_000, `refusal ${reason}`);
}

test('tenants: each is recognised its own way, reaches only its own agents, and every crossing is refused and counted', async (t) => {
  const ws = await makeWorkspace(t, 'kanal-tenants-');
  const p = await tenantPki(ws);
  const echo = await startEchoBackend(t);
  const server = await startTenantsServer(t, ws, tenantsYaml(ws, p, ['alpha', 'beta'], echo.address));
  const readyz = await (await fetch(`http://127.0.0.1:${server.healthPort}/readyz`)).text();
  t.regex(readyz, /tenant alpha: no agent connected/);
  t.regex(readyz, /tenant beta: no agent connected/);

  // Nothing connected to beta yet: beta's kube-apiserver finds no agent, though alpha's agent claims the very
  // address beta dials (destHost routes by such claims, docs/routing.md): identifiers count within a tenant only.
  const a1 = await alphaAgent(t, ws, server, p, 'node-1', true, ['--agent-identifiers', 'ipv4=127.0.0.1']);
  t.true(await echoes(viaAlpha(ws, echo.address), 'alpha via its socket'), "alpha's kube-apiserver reaches alpha's agent");
  const one = async (tenant: string): Promise<number> =>
    (await fetch(`http://127.0.0.1:${server.healthPort}/readyz?tenant=${tenant}`)).status;
  t.deepEqual([await one('alpha'), await one('beta'), await one('nobody')], [200, 503, 503], '/readyz?tenant= answers for one tenant');
  t.is(await refusedWith(viaFrontend(ws, server, p.betaKas, echo.address)), 500, "beta's kube-apiserver does not reach alpha's agent");

  // The same agentID in beta is another agent: both tenants work, neither replaces the other.
  await betaAgent(t, ws, server.agentPort, p, 'node-1');
  t.true(await echoes(viaFrontend(ws, server, p.betaKas, echo.address), 'beta via TCP'), "beta's kube-apiserver reaches beta's agent");
  t.true(await echoes(viaAlpha(ws, echo.address), 'alpha again'), 'alpha still served after beta registered node-1');

  // gRPC (the KAS's konnectivity-client) on both ways in: alpha's socket, beta's certificate on the TCP frontend.
  for (const [what, stream] of [
    ['alpha over gRPC on its socket', new ProxyStream(`unix://${path.join(ws.dir, 'alpha.sock')}`)],
    [
      'beta over gRPC on the TCP frontend',
      new ProxyStream(`127.0.0.1:${server.frontendPort}`, {
        credentials: grpc.credentials.createSsl(
          readFileSync(ws.pki.frontendCaCert),
          readFileSync(p.betaKas.key),
          readFileSync(p.betaKas.cert),
        ),
        channelOptions: { 'grpc.ssl_target_name_override': 'localhost', 'grpc.default_authority': 'localhost' },
      }),
    ],
  ] as const) {
    t.teardown(() => stream.cancel());
    const dial = await stream.dial(echo.address);
    t.is(dial.error, '', what);
    t.true(await stream.echoes(dial.connectID, Buffer.from(what), 10_000), what);
    stream.close();
  }

  // Right SNI (alpha's), another tenant's certificate (beta's): refused, both tenants named.
  const betaCred = await p.betaAgent('intruder');
  const wrongCert = await startAgent(t, ws, server, {
    agentID: 'intruder-1',
    cert: 'none',
    waitReady: false,
    extraArgs: [
      '--ca-cert',
      p.alphaServing.ca,
      '--tls-server-name',
      ALPHA_NAME,
      '--agent-cert',
      betaCred.cert,
      '--agent-key',
      betaCred.key,
    ],
  });
  const mismatch = await refusal(server, 'agent_tenant_mismatch');
  t.regex(JSON.stringify(mismatch), /alpha/);
  t.regex(JSON.stringify(mismatch), /beta/);
  await wrongCert.stop();

  // A certificate of neither tenant, no SNI: refused as no tenant's.
  await startAgent(t, ws, server, { agentID: 'rogue', cert: 'rogue', waitReady: false });
  await refusal(server, 'agent_tenant_unknown');

  // An agent certificate of beta on the frontend: not a kube-apiserver's, refused at the handshake.
  t.is(
    await refusedWith(
      viaFrontend(ws, server, betaCred, echo.address).catch((err: unknown) =>
        Promise.reject(err instanceof ConnectRefused ? err : new ConnectRefused(-2, 'handshake refused')),
      ),
    ),
    -2,
  );
  await refusal(server, 'frontend_certificate');
  // Alpha's kube-apiserver certificate (from beta's CA, so the TLS handshake passes) naming no tenant: refused.
  t.is(await refusedWith(viaFrontend(ws, server, p.alphaKas, echo.address)), -2);
  const unknownKas = await refusal(server, 'frontend_tenant_unknown');
  t.regex(JSON.stringify(unknownKas), /CN=alpha-kube-apiserver.*matches no pins of tenant/);

  const m = await scrapeMetrics(server.healthPort);
  t.true((m.get('kanal_refusals_total{reason="agent_tenant_mismatch"}') ?? 0) >= 1, 'the mismatch is counted');
  t.true((m.get('kanal_refusals_total{reason="frontend_tenant_unknown"}') ?? 0) >= 1, 'the frontend crossing is counted');
  t.is(m.get('kanal_server_agents{tenant="alpha"}'), 1, "alpha's gauge carries its tenant label");
  t.is(m.get('kanal_server_agents{tenant="beta"}'), 1);
  t.is(m.get('kanal_server_tenants'), 2);
  t.true(a1.running());
});

test('tenants: the file changes live; an invalid file changes nothing, a removed tenant is closed and the other keeps its transfer', async (t) => {
  const ws = await makeWorkspace(t, 'kanal-tenants-');
  const p = await tenantPki(ws);
  const echo = await startEchoBackend(t);
  const payload = Buffer.alloc(32 * 1024 * 1024, 7);
  for (let i = 0; i < payload.length; i += 4096) payload[i] = i & 0xff;
  const source = await startSourceBackend(t, payload);
  const server = await startTenantsServer(t, ws, tenantsYaml(ws, p, ['beta'], echo.address));
  await betaAgent(t, ws, server.agentPort, p, 'node-1');

  // A transfer of beta runs, slowly read, through every change below.
  const transfer = await viaFrontend(ws, server, p.betaKas, source.address);
  const received = readHashed(transfer, payload.length, 60_000, 16 * 1024 * 1024);

  // An invalid file: refused whole, logged, counted; beta untouched.
  await fs.writeFile(server.file, `${tenantsYaml(ws, p, ['beta'], echo.address)}    server-count: 0\n    bogus: 1\n`);
  const isRefusal = (o: Record<string, unknown>): boolean => o.msg === 'tenants file refused: the running tenants stay as they are';
  const refused = await server.waitForLine(isRefusal, 10_000, 'refused');
  // SIGHUP reads it again (the file did not change, so only the signal can): refused again.
  server.signal('SIGHUP');
  await server.waitForLine((o) => isRefusal(o) && o.time !== refused.time, 10_000, 'refused again on SIGHUP');
  t.deepEqual(refused.mistakes, [
    'tenant "beta": unknown setting "bogus" (a tenant takes the settings listed in docs/multi-tenant.md; ports, listeners and logging are the command line\'s)',
    'tenant "beta": server-count must be a positive integer, got 0',
  ]);
  t.true(await echoes(viaFrontend(ws, server, p.betaKas, echo.address), 'beta after an invalid file'));

  // Alpha added by writing the file (no signal): it serves at once.
  await fs.writeFile(server.file, tenantsYaml(ws, p, ['alpha', 'beta'], echo.address));
  await server.waitForLine((o) => o.msg === 'tenant added' && o.tenant === 'alpha', 10_000, 'alpha added');
  const a1 = await alphaAgent(t, ws, server, p, 'node-a');
  t.true(await echoes(viaAlpha(ws, echo.address), 'alpha after it was added'));

  // Alpha's settings changed (another allowed destination, a lower dial rate), its credentials not: applied in
  // place, its agent's tunnel and a connection open through it stay.
  const open = await viaAlpha(ws, echo.address);
  t.true(await echoRoundTrip(open, Buffer.from('before the change')));
  const changedYaml = tenantsYaml(ws, p, ['alpha', 'beta'], echo.address).replace(
    `    allowed-destination: [${echo.address}]\n`,
    `    allowed-destination: [${echo.address}, 127.0.0.1:1]\n    dial-rate: 100\n`,
  );
  await fs.writeFile(server.file, changedYaml);
  const inPlace = await server.waitForLine(
    (o) => o.msg === 'tenants file applied' && Array.isArray(o.inPlace) && o.inPlace.includes('alpha'),
    10_000,
    'alpha changed in place',
  );
  t.deepEqual([inPlace.changed, inPlace.added, inPlace.removed], [['alpha'], [], []]);
  t.true(await echoRoundTrip(open, Buffer.from('after the change')), "the connection open through alpha's agent carried on");
  open.destroy();
  t.false(
    server.logLines().some((l) => l.msg === 'agent disconnected' && l.tenant === 'alpha'),
    "alpha's agent kept its tunnel",
  );

  // Alpha removed: its agent's tunnel and socket go, one line; beta's transfer goes on.
  await fs.writeFile(server.file, tenantsYaml(ws, p, ['beta'], echo.address));
  const removed = await server.waitForLine(
    (o) => typeof o.msg === 'string' && o.msg.startsWith('tenant removed') && o.tenant === 'alpha',
    10_000,
    'alpha removed',
  );
  t.is(removed.agentTunnels, 1);
  await a1.waitForLine(
    (o) => o.msg === 'tunnel closed' || String(o.msg).includes('disconnected') || String(o.msg).includes('closed'),
    10_000,
    'alpha agent told',
  );
  t.true(
    await fs.stat(path.join(ws.dir, 'alpha.sock')).then(
      () => false,
      () => true,
    ),
    "alpha's socket is gone",
  );
  t.is(await received, sha256(payload), "beta's transfer arrived whole across three reloads");
  const m = await scrapeMetrics(server.healthPort);
  t.is(m.get('kanal_tenants_config_reloads_total{result="invalid"}'), 2);
  t.is(m.get('kanal_tenants_config_reloads_total{result="applied"}'), 3);
  t.is(m.get('kanal_server_tenants'), 1);
});

/** `kanal server --tenants-config FILE --dry-run` with the workspace's default agent-port pair, and `extra`. */
function dryRunTenants(ws: Workspace, file: string, extra: string[] = []): ReturnType<typeof runCli> {
  return runCli([
    'server',
    '--tenants-config',
    file,
    '--cluster-cert',
    ws.pki.serverCert,
    '--cluster-key',
    ws.pki.serverKey,
    ...extra,
    '--dry-run',
  ]);
}

test('tenants: a file with mistakes is reported whole at start (exit 2), and --dry-run checks it', async (t) => {
  const ws = await makeWorkspace(t, 'kanal-tenants-');
  const file = path.join(ws.dir, 'bad.yaml');
  await fs.writeFile(
    file,
    `apiVersion: kanal.dev/v1alpha1
kind: TenantsConfig
tenants:
  - name: Alpha
    cluster-ca-cert: ${ws.pki.caCert}
    uds-name: /tmp/a.sock
  - name: beta
    server-name: [beta.example]
    allowed-destination: [nope]
  - name: gamma
    cluster-ca-cert: ${ws.pki.caCert}
    uds-name: /tmp/a.sock
  - name: delta
    cluster-ca-cert: ${ws.pki.caCert}
    uds-name: /tmp/a.sock
`,
  );
  const r = await dryRunTenants(ws, file);
  t.is(r.code, 2, r.stderr);
  t.is(r.stdout, '', 'a file with mistakes prints nothing but them');
  t.regex(r.stderr, /name "Alpha": use a lowercase DNS label/);
  t.regex(r.stderr, /tenant "beta": allowed-destination/);
  t.regex(r.stderr, /tenant "beta": server-name needs cluster-cert and cluster-key/);
  t.regex(r.stderr, /tenant "beta": its agents need a credential/);
  t.regex(r.stderr, /tenant "delta": uds-name "\/tmp\/a.sock" is already tenant "gamma"'s/);
  const misplaced = await dryRunTenants(ws, file, ['--allowed-destination', '10.0.0.1:443']);
  t.is(misplaced.code, 2);
  t.regex(misplaced.stderr, /--allowed-destination is a tenant's setting with --tenants-config/);

  // Two tenants trusting one agents CA, one of them unpinned: its agents could be the other's. Refused.
  const shared = path.join(ws.dir, 'shared-ca.yaml');
  await fs.writeFile(
    shared,
    tenantsFile([
      `  - name: one\n    cluster-ca-cert: ${ws.pki.caCert}\n    agent-client-subject: [CN=one-*]\n    uds-name: ${path.join(ws.dir, 'one.sock')}\n`,
      `  - name: two\n    cluster-ca-cert: ${ws.pki.caCert}\n    uds-name: ${path.join(ws.dir, 'two.sock')}\n`,
    ]),
  );
  const unpinned = await dryRunTenants(ws, shared);
  t.is(unpinned.code, 2, unpinned.stderr);
  t.regex(unpinned.stderr, /tenant "two": its cluster-ca-cert \(CN=kanal-throwaway-ca\) is trusted by tenant "one" too: pin its agents/);

  // A good file: one JSON document, the configuration with the file's entries.
  const good = path.join(ws.dir, 'good.yaml');
  await fs.writeFile(
    good,
    tenantsFile([`  - name: one\n    cluster-ca-cert: ${ws.pki.caCert}\n    uds-name: ${path.join(ws.dir, 'one.sock')}\n`]),
  );
  const ok = await dryRunTenants(ws, good);
  t.is(ok.code, 0, ok.stderr);
  const doc = JSON.parse(ok.stdout) as { tenants: { file: string; entries: { name: string }[] } };
  t.is(doc.tenants.file, good);
  t.deepEqual(
    doc.tenants.entries.map((l) => l.name),
    ['one'],
  );
});

test('tenants over two workers: each tenant whole in its worker, a connection relayed to it, a dead worker restarted alone', async (t) => {
  const ws = await makeWorkspace(t, 'kanal-tenants-');
  const p = await tenantPki(ws);
  const echo = await startEchoBackend(t);
  const payload = Buffer.alloc(24 * 1024 * 1024, 3);
  for (let i = 0; i < payload.length; i += 4096) payload[i] = (i >> 12) & 0xff;
  const source = await startSourceBackend(t, payload);
  // ownerOf: alpha -> worker 0, beta -> worker 1 (workers/owner.ts).
  const server = await startTenantsServer(t, ws, tenantsYaml(ws, p, ['alpha', 'beta'], echo.address), ['--workers', '2']);
  const pids = new Map<number, number>();
  for (const w of [0, 1]) {
    const line = await server.waitForLine((o) => o.msg === 'worker ready' && o.worker === w, 30_000, `worker ${w} ready`);
    pids.set(w, Number(line.pid));
  }
  await alphaAgent(t, ws, server, p, 'node-1');
  // Beta's agents send no server name: the primary hands them to any worker, which relays them to beta's.
  await betaAgent(t, ws, server.agentPort, p, 'node-1');
  await betaAgent(t, ws, server.agentPort, p, 'node-2');
  t.true(await echoes(viaAlpha(ws, echo.address), 'alpha in worker 0'));
  for (let i = 0; i < 4; i++) t.true(await echoes(viaFrontend(ws, server, p.betaKas, echo.address), `beta in worker 1, try ${i}`));
  const m = await scrapeMetrics(server.healthPort);
  t.is(m.get('kanal_workers_ready{worker="primary"}'), 2);
  t.is(m.get('kanal_server_agents{tenant="alpha"}'), 1);
  t.is(m.get('kanal_server_agents{tenant="beta"}'), 2);
  t.true(
    m.has('process_resident_memory_bytes{worker="0"}') && m.has('process_resident_memory_bytes{worker="1"}'),
    'each worker reports itself',
  );

  // Alpha moves data while beta's worker dies: alpha's transfer is untouched, beta's worker comes back alone.
  const transfer = await viaAlpha(ws, source.address);
  const received = readHashed(transfer, payload.length, 60_000, 12 * 1024 * 1024, "alpha's transfer while beta's worker restarts");
  process.kill(pids.get(1) ?? 0, 'SIGKILL');
  await server.waitForLine((o) => o.msg === 'worker ready' && o.worker === 1 && Number(o.pid) !== pids.get(1), 60_000, 'worker 1 back');
  t.is(await received, sha256(payload), "alpha's transfer arrived whole while beta's worker was restarted");
  const deadline = Date.now() + 60_000;
  let beta = false;
  while (!beta && Date.now() < deadline)
    beta = await echoes(viaFrontend(ws, server, p.betaKas, echo.address), 'beta after its worker restarted').catch(() => false);
  t.true(beta, "beta's agents came back to its new worker");
  const after = await scrapeMetrics(server.healthPort);
  t.is(after.get('kanal_worker_restarts_total{worker="1"}'), 1);
});

test("tenants behind one address: two shared servers, each of beta's agents holds a tunnel to both, beta's count right", async (t) => {
  const ws = await makeWorkspace(t, 'kanal-tenants-');
  const p = await tenantPki(ws);
  const echo = await startEchoBackend(t);
  const yaml = tenantsYaml(ws, p, ['beta'], echo.address).replace('    proxy-strategies: destHost,default\n', '    server-count: 2\n');
  const servers = [await startTenantsServer(t, ws, yaml, [], 'server-a'), await startTenantsServer(t, ws, yaml, [], 'server-b')];
  const lbPort = await roundRobin(t, () => servers.map((s) => s.agentPort));
  const agent = await betaAgent(t, ws, lbPort, p, 'node-1');
  const deadline = Date.now() + 20_000;
  let detail = '';
  while (!/2\/2 server tunnel\(s\) up/.test(detail) && Date.now() < deadline) {
    detail = await (await fetch(agent.readyzUrl())).text();
    await sleep(100);
  }
  t.regex(detail, /2\/2 server tunnel\(s\) up/, "beta's server-count (2) reached the agent through the shared servers");
  for (const s of servers) t.true(await echoes(viaFrontend(ws, s, p.betaKas, echo.address), `beta through ${s.name}`));
});
