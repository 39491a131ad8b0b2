/**
 * docs/certificates.md works as written: every `sh` block of the page runs,
 * in order, in a temp dir; a server and an agent start with the result (agent
 * side and frontend side on separate CAs); a CONNECT with the kube-apiserver's
 * certificate reaches a backend through the agent; and each side refuses the
 * other side's certificate.
 */
import test from 'ava';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import tls from 'node:tls';
import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import {
  echoRoundTrip,
  httpConnect,
  makeWorkspace,
  startAgent,
  startEchoBackend,
  startServer,
  waitClosed,
  waitMetrics,
} from '../helpers/kanal-processes.js';

const GUIDE = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..', 'docs', 'certificates.md');
/** The frontend and agent-port name the guide's example SANs carry. */
const SERVER_NAME = 'kanal.cp.example.internal';

function runGuide(dir: string): Promise<{ code: number; output: string }> {
  const blocks = [...fs.readFileSync(GUIDE, 'utf8').matchAll(/```sh\n([\s\S]*?)```/g)].map((m) => m[1]);
  return new Promise((resolve) => {
    execFile('bash', ['-c', `set -euo pipefail\n${blocks.join('\n')}`], { cwd: dir, timeout: 60_000 }, (err, stdout, stderr) => {
      resolve({ code: err ? (typeof err.code === 'number' ? err.code : -1) : 0, output: `${stdout}${stderr}` });
    });
  });
}

function tlsToFrontend(port: number, files: { ca: string; cert: string; key: string }): Promise<tls.TLSSocket> {
  return new Promise((resolve, reject) => {
    const s = tls.connect({
      host: '127.0.0.1',
      port,
      servername: SERVER_NAME,
      ca: fs.readFileSync(files.ca),
      cert: fs.readFileSync(files.cert),
      key: fs.readFileSync(files.key),
      ALPNProtocols: ['http/1.1'],
    });
    s.once('secureConnect', () => resolve(s));
    s.once('error', reject);
  });
}

test('the certificate guide: its commands run, and a server and an agent work with what they made', async (t) => {
  const ws = await makeWorkspace(t);
  const dir = path.join(ws.dir, 'guide');
  fs.mkdirSync(dir);
  const run = await runGuide(dir);
  t.is(run.code, 0, run.output);
  t.regex(run.output, /agent-port\.crt: OK/);
  t.regex(run.output, /kas-client\.crt: OK/);
  t.is(run.output.match(/refused, as it should be/g)?.length, 2, 'each CA refuses the other side');
  const f = (name: string): string => path.join(dir, name);

  const backend = await startEchoBackend(t);
  const server = await startServer(t, ws, {
    frontend: 'tcp',
    extraArgs: [
      '--cluster-cert',
      f('agent-port.crt'),
      '--cluster-key',
      f('agent-port.key'),
      '--cluster-ca-cert',
      f('agent-ca.crt'),
      '--server-cert',
      f('frontend.crt'),
      '--server-key',
      f('frontend.key'),
      '--server-ca-cert',
      f('frontend-ca.crt'),
      '--mode',
      'http-connect',
    ],
  });
  await startAgent(t, ws, server, {
    agentID: 'node-1',
    cert: 'none',
    extraArgs: [
      '--ca-cert',
      f('agent-ca.crt'),
      '--agent-cert',
      f('node-1.crt'),
      '--agent-key',
      f('node-1.key'),
      '--tls-server-name',
      SERVER_NAME,
    ],
  });
  await waitMetrics(server.healthPort, { kanal_server_agents: 1 }, 10_000);

  // The kube-apiserver's side: its client certificate, the frontend verified against the frontend CA.
  const kas = await tlsToFrontend(server.frontendPort, { ca: f('frontend-ca.crt'), cert: f('kas-client.crt'), key: f('kas-client.key') });
  const tunnel = await httpConnect(kas, backend.address);
  t.teardown(() => tunnel.destroy());
  t.true(await echoRoundTrip(tunnel, randomBytes(64 * 1024)));

  // A node's certificate does not open the frontend.
  const node = await tlsToFrontend(server.frontendPort, { ca: f('frontend-ca.crt'), cert: f('node-1.crt'), key: f('node-1.key') }).catch(
    () => undefined,
  );
  if (node) {
    node.write(`CONNECT ${backend.address} HTTP/1.1\r\nHost: ${backend.address}\r\n\r\n`);
    const answer: Buffer[] = [];
    node.on('data', (c: Buffer) => answer.push(c));
    await waitClosed(node, 10_000);
    t.false(Buffer.concat(answer).toString().includes(' 200 '), 'the node certificate got no tunnel');
  }
  t.is(backend.accepted(), 1, 'only the kube-apiserver reached the backend');
});
