/**
 * docs/certificates.md works as written: every `sh` block of the page runs,
 * in order, in a temp dir; a server and an agent start with the files its
 * last block lays out per machine (agent side and frontend side on separate
 * CAs); a CONNECT with the kube-apiserver's certificate reaches a backend
 * through the agent; and each side refuses the other side's certificate.
 * And the other pages that name credential files or the server's name use
 * the ones this page makes, so a newcomer's files match every page.
 */
import test from 'ava';
import fs from 'node:fs';
import path from 'node:path';
import tls from 'node:tls';
import { randomBytes } from 'node:crypto';
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
import { readRepoFile, runBash, shBlocks } from '../helpers/doc-blocks.js';

const GUIDE = 'docs/certificates.md';
/** The frontend and agent-port name the guide's example SANs carry. */
const SERVER_NAME = 'kanal.cp.example.internal';
/** Pages, deployment files and scripts that name the credential files. */
const NAMING_FILES = [
  'README.md',
  'docs/operators-guide.md',
  'docs/trust-model.md',
  'docs/operations.md',
  'deploy/agent.env.example',
  'deploy/server.env.example',
  'deploy/server-tcp.env.example',
  'deploy/egress-selector/tcp-mtls-http-connect.yaml',
  'static-pods/kanal-agent.yaml',
  'static-pods/kanal-server.yaml',
  'systemd/kanal-agent.service',
  'systemd/kanal-server.service',
  'scripts/try-loopback.sh',
];
/** Files where `--proxy-server-host` names the server of certificates.md (the others make their own certificates). */
const SERVER_NAMING_FILES = NAMING_FILES.filter((f) => f !== 'README.md' && f !== 'scripts/try-loopback.sh');

/** Every file under dir, as paths relative to it. */
function filesUnder(dir: string): string[] {
  return fs.readdirSync(dir, { recursive: true, encoding: 'utf8' }).filter((f) => fs.statSync(path.join(dir, f)).isFile());
}

/** `.crt` and `.key` names a text mentions, with the page's node placeholders as the guide's node. */
function credentialNames(text: string): string[] {
  return [...text.matchAll(/[\w<>$./-]+\.(?:crt|key)\b/g)]
    .map((m) => m[0].replace(/<node>|\$NODE|\bNODE\b/g, 'node-1'))
    .filter((name) => !name.startsWith('.'));
}

/** The SANs of `AGENT_PORT_SANS=` or `FRONTEND_SANS=` in the guide, without their DNS:/IP: prefixes. */
function guideSans(variable: string): string[] {
  const line = new RegExp(`^${variable}="([^"]*)"`, 'm').exec(readRepoFile(GUIDE));
  if (!line) throw new Error(`${GUIDE} sets no ${variable}`);
  return line[1].split(',').map((san) => san.replace(/^(DNS|IP):/, ''));
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
  const run = await runBash(t, shBlocks(GUIDE).join('\n'), { cwd: dir, timeoutMs: 60_000 });
  t.is(run.code, 0, run.output);
  t.regex(run.output, /server\.crt: OK/);
  t.regex(run.output, /frontend-client\.crt: OK/);
  t.is(run.output.match(/refused, as it should be/g)?.length, 2, 'each CA refuses the other side');
  // The files as each machine gets them.
  const cp = (name: string): string => path.join(dir, 'out/control-plane/etc/kanal', name);
  const node = (name: string): string => path.join(dir, 'out/node-1/etc/kanal', name);
  const kasFile = (name: string): string => path.join(dir, 'out/kube-apiserver/etc/kubernetes/pki/kanal', name);

  const backend = await startEchoBackend(t);
  const server = await startServer(t, ws, {
    frontend: 'tcp',
    extraArgs: [
      '--cluster-cert',
      cp('server.crt'),
      '--cluster-key',
      cp('server.key'),
      '--cluster-ca-cert',
      cp('ca.crt'),
      '--server-cert',
      cp('frontend.crt'),
      '--server-key',
      cp('frontend.key'),
      '--server-ca-cert',
      cp('frontend-ca.crt'),
      '--mode',
      'http-connect',
    ],
  });
  await startAgent(t, ws, server, {
    agentID: 'node-1',
    cert: 'none',
    extraArgs: [
      '--ca-cert',
      node('ca.crt'),
      '--agent-cert',
      node('agent.crt'),
      '--agent-key',
      node('agent.key'),
      '--tls-server-name',
      SERVER_NAME,
    ],
  });
  await waitMetrics(server.healthPort, { kanal_server_agents: 1 }, 10_000);

  // The kube-apiserver's side: its client certificate, the frontend verified against the frontend CA.
  const kas = await tlsToFrontend(server.frontendPort, {
    ca: kasFile('frontend-ca.crt'),
    cert: kasFile('frontend-client.crt'),
    key: kasFile('frontend-client.key'),
  });
  const tunnel = await httpConnect(kas, backend.address);
  t.teardown(() => tunnel.destroy());
  t.true(await echoRoundTrip(tunnel, randomBytes(64 * 1024)));

  // A node's certificate does not open the frontend.
  const nodeTls = await tlsToFrontend(server.frontendPort, {
    ca: kasFile('frontend-ca.crt'),
    cert: node('agent.crt'),
    key: node('agent.key'),
  }).catch(() => undefined);
  if (nodeTls) {
    nodeTls.write(`CONNECT ${backend.address} HTTP/1.1\r\nHost: ${backend.address}\r\n\r\n`);
    const answer: Buffer[] = [];
    nodeTls.on('data', (c: Buffer) => answer.push(c));
    await waitClosed(nodeTls, 10_000);
    t.false(Buffer.concat(answer).toString().includes(' 200 '), 'the node certificate got no tunnel');
  }
  t.is(backend.accepted(), 1, 'only the kube-apiserver reached the backend');
});

test('every page names only credential files certificates.md makes, and the server by a name its certificate carries', async (t) => {
  const ws = await makeWorkspace(t);
  const dir = path.join(ws.dir, 'guide');
  fs.mkdirSync(dir);
  const run = await runBash(t, shBlocks(GUIDE).join('\n'), { cwd: dir, timeoutMs: 60_000 });
  t.is(run.code, 0, run.output);
  const made = filesUnder(dir).filter((f) => /\.(crt|key)$/.test(f));
  // out/<machine>/etc/... is the machine's /etc/...
  const installed = new Set(made.filter((f) => f.startsWith('out/')).map((f) => `/${f.split('/').slice(2).join('/')}`));
  const relative = new Set(made);
  const basenames = new Set(made.map((f) => path.basename(f)));

  const wrong: string[] = [];
  let checked = 0;
  for (const file of NAMING_FILES) {
    for (const name of credentialNames(readRepoFile(file))) {
      checked++;
      const known = name.startsWith('/') ? installed.has(name) : name.includes('/') ? relative.has(name) : basenames.has(name);
      if (!known) wrong.push(`${file}: ${name}`);
    }
  }
  t.deepEqual(wrong, [], `names ${GUIDE} does not make (its section 4 says where each file goes)`);
  t.true(checked > 50, `only ${checked} names found: the pattern no longer matches the pages`);

  const agentPortSans = guideSans('AGENT_PORT_SANS');
  const badHosts: string[] = [];
  for (const file of SERVER_NAMING_FILES) {
    const text = readRepoFile(file);
    // A name has a dot (a host name or an address); prose after the flag ("--tls-server-name to a name it carries") is not one.
    const serverNames = [...text.matchAll(/--tls-server-name[= ]([^\s"\\`]+)/g)].map((m) => m[1]).filter((n) => n.includes('.'));
    for (const name of serverNames) if (!agentPortSans.includes(name)) badHosts.push(`${file}: --tls-server-name ${name}`);
    for (const m of text.matchAll(/--proxy-server-host[= ]([^\s"\\`]+)/g)) {
      const host = m[1].replace(/:\d+$/, '');
      // Prose ("--proxy-server-host is required") and placeholders are not a server's name.
      if (!/[.:]/.test(host) || /[$<]/.test(host) || agentPortSans.includes(host) || serverNames.length > 0) continue;
      badHosts.push(`${file}: --proxy-server-host ${host}`);
    }
  }
  t.deepEqual(badHosts, [], `server names that AGENT_PORT_SANS in ${GUIDE} does not carry (${agentPortSans.join(', ')})`);
  const egress = readRepoFile('deploy/egress-selector/tcp-mtls-http-connect.yaml');
  const url = /url: https:\/\/([^:/\s]+)/.exec(egress);
  t.truthy(url, 'the TCP egress selector has a url');
  t.true(guideSans('FRONTEND_SANS').includes(url?.[1] ?? ''), `the egress url's host ${url?.[1]} is in FRONTEND_SANS`);
});
