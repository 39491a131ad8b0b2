/**
 * A server with --frontend-clients-config and a real agent, in this process:
 * a client recognised by its Unix peer's uid (this process's) reaches the one
 * port its entry allows through HTTP CONNECT and is refused another with 403
 * naming the rule, audited with its name and counted; a process of another
 * uid is no client. Without clients: the kube-apiserver's path is the one
 * server-agent-inprocess.test.ts covers.
 */
import fs from 'node:fs';
import path from 'node:path';
import test, { type ExecutionContext } from 'ava';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  makeEnv,
  startAgent,
  startEchoServer,
  startServer,
  httpConnect,
  echoRoundTrip,
  waitFor,
  grpcFrontendClient,
} from '../../helpers/in-process.js';
import { Feature } from '../../../src/wire/features.js';
import { auditRecords, metricValue } from '../../helpers/audit-log.js';
import { ONE_CLUSTER } from '../../../src/server/tenants/tenant-rooms.js';

/** This process's uid, which a `uid:` entry recognises it by; undefined (the test passes, saying why) where there is none. */
function ownUid(t: ExecutionContext): number | undefined {
  const uid = process.getuid?.();
  if (uid === undefined) {
    t.log('skipped: no process.getuid on this platform');
    t.pass();
  }
  return uid;
}

test('a uid-recognised client reaches its allowed port and gets 403 naming its rules for another, audited and counted', async (t) => {
  const uid = ownUid(t);
  if (uid === undefined) return;
  const env = await makeEnv(t);
  const allowed = await startEchoServer(t);
  const other = await startEchoServer(t);
  const clientsFile = path.join(env.dir, 'clients.yaml');
  fs.writeFileSync(clientsFile, `clients:\n- name: scraper\n  uid: ${uid}\n  allow:\n  - cidr: 127.0.0.0/8\n    port: ${allowed.port}\n`);
  const auditFile = path.join(env.dir, 'audit.log');
  const { server } = await startServer(t, env, { extraFlags: ['--frontend-clients-config', clientsFile, '--audit-log-path', auditFile] });
  const { agent } = await startAgent(t, env, server.agentPort);
  await waitFor(() => server.registry.size === 1 && agent.tunnels().length === 1, 'agent connected');

  const ok = await httpConnect(env.udsPath, allowed.address);
  t.teardown(() => void ok.socket.destroy());
  t.is(ok.status, 200, ok.head);
  t.is(await echoRoundTrip(ok.socket, 'hello'), 'hello');

  const refused = await httpConnect(env.udsPath, other.address);
  t.teardown(() => void refused.socket.destroy());
  t.is(refused.status, 403, refused.head);
  const body = await new Promise<string>((resolve) => {
    let text = '';
    refused.socket.setEncoding('utf8');
    refused.socket.on('data', (c: string) => (text += c));
    refused.socket.once('end', () => resolve(text));
    refused.socket.resume();
  });
  t.is(
    body.trim(),
    `client "scraper" may not reach ${other.address}: no rule allows it (the rules of scraper: cidr 127.0.0.0/8 port ${allowed.port})`,
  );
  t.is(other.open, 0, 'nothing reached the refused port');

  // The gRPC frontend: the same client, the same rules; a refused destination is its DIAL_RSP's error.
  const grpc = await grpcFrontendClient(t, env.udsPath, new Set([Feature.Window, Feature.HalfClose]));
  const conn = await grpc.tunnel.dial(allowed.address, { timeoutMs: 5000 });
  t.truthy(conn);
  conn.close();
  const grpcErr = await t.throwsAsync(grpc.tunnel.dial(other.address, { timeoutMs: 5000 }));
  t.regex(
    grpcErr?.message ?? '',
    /client "scraper" may not reach .*: no rule allows it \(the rules of scraper: cidr 127\.0\.0\.0\/8 port \d+\)/,
  );
  grpc.close();

  // A name is resolved by the agent before any rule applies; one with no address is a 502 naming it, counted on both sides.
  const missing = await httpConnect(env.udsPath, `no-such-name.invalid:${allowed.port}`);
  t.teardown(() => void missing.socket.destroy());
  t.is(missing.status, 502, missing.head);

  const metrics = server.tenant(ONE_CLUSTER).metrics.registry;
  t.is(await metricValue(metrics, 'kanal_name_resolutions_total', { result: 'unresolved' }), 1);
  t.is(await metricValue(agent.metrics.registry, 'kanal_name_resolutions_total', { result: 'unresolved' }), 1);
  t.is(await metricValue(metrics, 'kanal_frontend_client_dials_total', { client: 'scraper', result: 'unresolved' }), 1);
  t.is(await metricValue(metrics, 'kanal_refusals_total', { reason: 'client_forbidden' }), 2);
  t.is(await metricValue(metrics, 'kanal_frontend_client_dials_total', { client: 'scraper', result: 'forbidden' }), 2);
  t.is(await metricValue(metrics, 'kanal_frontend_client_dials_total', { client: 'scraper', result: 'ok' }), 2);
  // The gRPC connection's close reaches the server's count a moment later: polled, bounded.
  let open = await metricValue(metrics, 'kanal_frontend_client_connections', { client: 'scraper' });
  for (let i = 0; i < 100 && open !== 1; i++) {
    await sleep(50);
    open = await metricValue(metrics, 'kanal_frontend_client_connections', { client: 'scraper' });
  }
  t.is(open, 1, 'the CONNECT tunnel still open; the gRPC connection counted closed');

  const records = (): Record<string, unknown>[] => auditRecords(auditFile);
  await waitFor(() => records().some((r) => r.event === 'dial'), 'the refused dial audited');
  t.like(
    records().find((r) => r.event === 'dial'),
    { destination: other.address, refusal: 'client_forbidden', client: { name: 'scraper', uid }, dial: { result: 'forbidden' } },
  );
});

test('--frontend-clients-config is re-read when it changes: a new rule applies to the next dial, a file with mistakes leaves the list running', async (t) => {
  const uid = ownUid(t);
  if (uid === undefined) return;
  const env = await makeEnv(t);
  const first = await startEchoServer(t);
  const second = await startEchoServer(t);
  const clientsFile = path.join(env.dir, 'clients.yaml');
  const allowing = (...ports: number[]): string =>
    `clients:\n- name: scraper\n  uid: ${uid}\n  allow:\n${ports.map((p) => `  - cidr: 127.0.0.0/8\n    port: ${p}\n`).join('')}`;
  fs.writeFileSync(clientsFile, allowing(first.port));
  const { server } = await startServer(t, env, { extraFlags: ['--frontend-clients-config', clientsFile] });
  const { agent } = await startAgent(t, env, server.agentPort);
  await waitFor(() => server.registry.size === 1 && agent.tunnels().length === 1, 'agent connected');
  const status = async (address: string): Promise<number> => {
    const c = await httpConnect(env.udsPath, address);
    c.socket.destroy();
    return c.status;
  };
  t.is(await status(second.address), 403);
  const held = await httpConnect(env.udsPath, first.address);
  t.teardown(() => void held.socket.destroy());
  t.is(held.status, 200);

  fs.writeFileSync(clientsFile, allowing(first.port, second.port));
  const metrics = server.tenant(ONE_CLUSTER).metrics.registry;
  await waitFor(() => server.tenant(ONE_CLUSTER).clients.configured, 'configured');
  let reloaded = false;
  for (let i = 0; i < 200 && !reloaded; i++) {
    reloaded = (await metricValue(metrics, 'kanal_frontend_clients_config_reloads_total', { result: 'applied' })) === 1;
    if (!reloaded) await sleep(50);
  }
  t.true(reloaded, 'the change was applied within 10 s');
  t.is(await status(second.address), 200);
  t.is(await echoRoundTrip(held.socket, 'still here'), 'still here', 'a connection open across the reload stays');

  fs.writeFileSync(clientsFile, 'clients:\n- name: scraper\n  uid: not-a-number\n');
  let refused = false;
  for (let i = 0; i < 200 && !refused; i++) {
    refused = (await metricValue(metrics, 'kanal_frontend_clients_config_reloads_total', { result: 'invalid' })) === 1;
    if (!refused) await sleep(50);
  }
  t.true(refused, 'the broken file was refused within 10 s');
  t.is(await status(second.address), 200, 'the running list stays');
});

test('a gRPC stream presents a token in its authorization metadata: admitted as the token-file entry; a wrong or unusable one is refused saying so', async (t) => {
  const env = await makeEnv(t);
  const allowed = await startEchoServer(t);
  const token = 'ingress-operator-token-0123456789';
  const tokenFile = path.join(env.dir, 'ingress.token');
  fs.writeFileSync(tokenFile, `${token}\n`);
  const clientsFile = path.join(env.dir, 'clients.yaml');
  fs.writeFileSync(
    clientsFile,
    `clients:\n- name: ingress-operator\n  token-file: ${tokenFile}\n  allow:\n  - cidr: 127.0.0.0/8\n    port: ${allowed.port}\n`,
  );
  const { server } = await startServer(t, env, { extraFlags: ['--frontend-clients-config', clientsFile] });
  const { agent } = await startAgent(t, env, server.agentPort);
  await waitFor(() => server.registry.size === 1 && agent.tunnels().length === 1, 'agent connected');
  const features = new Set([Feature.Window, Feature.HalfClose]);

  const good = await grpcFrontendClient(t, env.udsPath, features, { authorization: `Bearer ${token}` });
  const conn = await good.tunnel.dial(allowed.address, { timeoutMs: 5000 });
  t.truthy(conn);
  conn.close();
  good.close();
  const metrics = server.tenant(ONE_CLUSTER).metrics.registry;
  t.is(await metricValue(metrics, 'kanal_frontend_client_dials_total', { client: 'ingress-operator', result: 'ok' }), 1);

  const wrong = await grpcFrontendClient(t, env.udsPath, features, { authorization: 'Bearer not-the-token' });
  const wrongErr = await t.throwsAsync(wrong.tunnel.dial(allowed.address, { timeoutMs: 5000 }));
  t.regex(wrongErr?.message ?? '', /the bearer token of .* is no client entry's token/);
  wrong.close();

  const basic = await grpcFrontendClient(t, env.udsPath, features, { authorization: 'Basic dXNlcjp0b2tlbg==' });
  const basicErr = await t.throwsAsync(basic.tunnel.dial(allowed.address, { timeoutMs: 5000 }));
  t.regex(basicErr?.message ?? '', /\(authorization scheme "basic" not supported: use Bearer <token>\)/);
  basic.close();
});
