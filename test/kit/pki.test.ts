import test from 'ava';
import { X509Certificate, createPrivateKey } from 'node:crypto';
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import type { AddressInfo } from 'node:net';
import { createCertificateAuthority } from '../../kit/pki/certificate-authority.js';
import { writeThrowawayPki, type ThrowawayPki } from '../../kit/pki/throwaway-pki.js';

let dir = '';
let pki: ThrowawayPki;

test.before(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'kanal-pki-'));
  pki = await writeThrowawayPki(path.join(dir, 'pki'), { serverIps: ['10.96.0.1'], serverDns: ['kanal.example'] });
});

test.after.always(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
});

const read = (file: string): Promise<string> => readFile(file, 'utf8');

interface HandshakeResult {
  /** What the server saw; undefined if the handshake never completed on the server side. */
  serverAuthorized?: boolean;
  serverAuthorizationError?: string;
  peerCommonName?: string;
  clientError?: string;
  clientAuthorized?: boolean;
}

/** A real mTLS handshake against a server trusting ca.crt (or `trust`), presenting the given client cert. */
async function handshake(clientCert: string, clientKey: string, rejectUnauthorized = true, trust = pki.caCert): Promise<HandshakeResult> {
  const [ca, clientCa, cert, key, ccert, ckey] = await Promise.all(
    [pki.caCert, trust, pki.serverCert, pki.serverKey, clientCert, clientKey].map(read),
  );
  const result: HandshakeResult = {};
  const server = tls.createServer({ requestCert: true, rejectUnauthorized, ca: clientCa, cert, key }, (socket) => {
    result.serverAuthorized = socket.authorized;
    result.serverAuthorizationError = socket.authorizationError?.toString();
    const peer = socket.getPeerCertificate();
    result.peerCommonName = typeof peer.subject?.CN === 'string' ? peer.subject.CN : undefined;
    socket.end('hello');
  });
  server.on('tlsClientError', (err) => {
    result.serverAuthorized = false;
    result.serverAuthorizationError = err.message;
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  try {
    await new Promise<void>((resolve) => {
      const socket = tls.connect({ host: '127.0.0.1', port, ca, cert: ccert, key: ckey, servername: 'localhost' });
      socket.on('secureConnect', () => {
        result.clientAuthorized = socket.authorized;
      });
      socket.on('data', () => undefined);
      socket.on('error', (err: Error) => {
        result.clientError = err.message;
        resolve();
      });
      socket.on('close', () => resolve());
    });
  } finally {
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
  return result;
}

test('all files exist with absolute paths; keys are 0600', async (t) => {
  const paths: Record<keyof ThrowawayPki, string> = pki;
  const files = Object.entries(paths).filter(([k]) => k !== 'dir');
  t.true(files.length >= 15);
  for (const [name, file] of files) {
    t.true(path.isAbsolute(file), name);
    const st = await stat(file);
    if (file.endsWith('.key')) t.is(st.mode & 0o777, 0o600, `${name} mode`);
    const pem = await read(file);
    t.regex(pem, file.endsWith('.key') ? /^-----BEGIN PRIVATE KEY-----\n/ : /^-----BEGIN CERTIFICATE-----\n/, name);
  }
  const key = createPrivateKey(await read(pki.agentKey));
  t.is(key.asymmetricKeyType, 'ec');
  t.is(key.asymmetricKeyDetails?.namedCurve, 'prime256v1');
});

test('server and frontend certificates: SANs, issuer, CA flags', async (t) => {
  const ca = new X509Certificate(await read(pki.caCert));
  const frontendCa = new X509Certificate(await read(pki.frontendCaCert));
  for (const c of [ca, frontendCa]) {
    t.true(c.ca);
    t.true(c.verify(c.publicKey));
  }
  for (const [file, issuer] of [
    [pki.serverCert, ca],
    [pki.frontendCert, frontendCa],
  ] as const) {
    const cert = new X509Certificate(await read(file));
    t.false(cert.ca);
    t.true(cert.checkIssued(issuer));
    t.true(cert.verify(issuer.publicKey));
    t.is(cert.checkIP('127.0.0.1'), '127.0.0.1');
    t.is(cert.checkIP('::1'), '::1');
    t.is(cert.checkIP('10.96.0.1'), '10.96.0.1');
    t.is(cert.checkIP('192.0.2.1'), undefined);
    t.is(cert.checkHost('localhost'), 'localhost');
    t.is(cert.checkHost('kanal.example'), 'kanal.example');
    t.deepEqual(cert.keyUsage, ['1.3.6.1.5.5.7.3.1']);
    t.true(new Date(cert.validFrom).getTime() < Date.now());
  }
  const agent = new X509Certificate(await read(pki.agentCert));
  t.regex(agent.subject, /CN=kanal-agent/);
  t.deepEqual(agent.keyUsage, ['1.3.6.1.5.5.7.3.2']);
  t.true(agent.checkIssued(ca));
  const rogue = new X509Certificate(await read(pki.rogueAgentCert));
  t.false(rogue.checkIssued(ca));
  t.true(rogue.checkIssued(new X509Certificate(await read(pki.rogueCaCert))));
});

test('usage "both" carries serverAuth and clientAuth; serials differ', async (t) => {
  const ca = await createCertificateAuthority('test-ca');
  const a = await ca.issue({ commonName: 'both', usage: 'both', dnsNames: ['x.test'], validDays: 2 });
  const b = await ca.issue({ commonName: 'both', usage: 'both' });
  const ca509 = new X509Certificate(ca.certPem);
  const certA = new X509Certificate(a.certPem);
  t.deepEqual([...(certA.keyUsage ?? [])].sort(), ['1.3.6.1.5.5.7.3.1', '1.3.6.1.5.5.7.3.2']);
  t.true(certA.checkIssued(ca509));
  t.not(certA.serialNumber, new X509Certificate(b.certPem).serialNumber);
  t.true(new Date(certA.validTo).getTime() - Date.now() < 3 * 24 * 3600 * 1000);
  await t.throwsAsync(ca.issue({ commonName: 'bad', usage: 'server', ipAddresses: ['not-an-ip'] }));
});

test('tls: agent certificate is accepted by a server trusting ca.crt', async (t) => {
  const r = await handshake(pki.agentCert, pki.agentKey);
  t.is(r.clientError, undefined);
  t.true(r.clientAuthorized, 'client verified server.crt for 127.0.0.1');
  t.true(r.serverAuthorized);
  t.is(r.peerCommonName, 'kanal-agent');
});

test('tls: the two sides have separate CAs: the frontend-client certificate verifies only against frontend-ca.crt', async (t) => {
  const r = await handshake(pki.frontendClientCert, pki.frontendClientKey, true, pki.frontendCaCert);
  t.true(r.serverAuthorized);
  t.is(r.peerCommonName, 'kube-apiserver');
  const onAgentSide = await handshake(pki.frontendClientCert, pki.frontendClientKey, false);
  t.false(onAgentSide.serverAuthorized);
  const agentOnFrontend = await handshake(pki.agentCert, pki.agentKey, false, pki.frontendCaCert);
  t.false(agentOnFrontend.serverAuthorized);
});

test('tls: rogue agent certificate is refused', async (t) => {
  const r = await handshake(pki.rogueAgentCert, pki.rogueAgentKey);
  t.log(`server: ${r.serverAuthorizationError ?? '-'}; client: ${r.clientError ?? '-'}`);
  t.not(r.serverAuthorized, true);
  t.is(r.peerCommonName, undefined, 'server application never saw the rogue peer');
  t.truthy(r.serverAuthorizationError ?? r.clientError);
});

test('tls: with rejectUnauthorized=false the server sees the rogue agent as unauthorized', async (t) => {
  const r = await handshake(pki.rogueAgentCert, pki.rogueAgentKey, false);
  t.is(r.serverAuthorized, false);
  t.is(r.peerCommonName, 'kanal-agent');
  t.regex(r.serverAuthorizationError ?? '', /UNABLE_TO_VERIFY_LEAF_SIGNATURE|UNABLE_TO_GET_ISSUER_CERT/);
  const good = await handshake(pki.agentCert, pki.agentKey, false);
  t.true(good.serverAuthorized);
});

function run(cmd: string, args: string[]): Promise<{ code: number | null; out: string; missing: boolean }> {
  return new Promise((resolve) => {
    execFile(cmd, args, (err, stdout, stderr) => {
      const e = err as (NodeJS.ErrnoException & { code?: number | string }) | null;
      if (e && e.code === 'ENOENT') return resolve({ code: null, out: '', missing: true });
      resolve({ code: e ? (typeof e.code === 'number' ? e.code : 1) : 0, out: stdout + stderr, missing: false });
    });
  });
}

test('openssl verify accepts the chains and rejects the rogue one', async (t) => {
  const probe = await run('openssl', ['version']);
  if (probe.missing) {
    t.log('openssl not installed; skipping');
    t.pass();
    return;
  }
  for (const [file, ca] of [
    [pki.serverCert, pki.caCert],
    [pki.agentCert, pki.caCert],
    [pki.frontendCert, pki.frontendCaCert],
    [pki.frontendClientCert, pki.frontendCaCert],
  ] as const) {
    const r = await run('openssl', ['verify', '-CAfile', ca, file]);
    t.is(r.code, 0, r.out);
  }
  const crossed = await run('openssl', ['verify', '-CAfile', pki.caCert, pki.frontendClientCert]);
  t.not(crossed.code, 0, 'the KAS client certificate does not verify against the agent CA');
  const server = await run('openssl', ['verify', '-CAfile', pki.caCert, '-purpose', 'sslserver', pki.serverCert]);
  t.is(server.code, 0, server.out);
  const client = await run('openssl', ['verify', '-CAfile', pki.caCert, '-purpose', 'sslclient', pki.agentCert]);
  t.is(client.code, 0, client.out);
  const rogue = await run('openssl', ['verify', '-CAfile', pki.caCert, pki.rogueAgentCert]);
  t.not(rogue.code, 0);
});
