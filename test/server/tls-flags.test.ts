/**
 * The TLS 1.3 suite order the server's listeners use (src/server/tls-flags.ts):
 * Go's, so a Kanal server negotiates what an upstream one does, and the
 * cheaper AES-128-GCM where the CPU runs it in hardware (#15).
 */
import test from 'ava';
import tls from 'node:tls';
import { createCertificateAuthority } from '../../kit/pki/certificate-authority.js';
import { defaultCipherList, tls13Suites } from '../../src/server/tls-flags.js';

const ALL_TLS13 = ['TLS_AES_128_GCM_SHA256', 'TLS_AES_256_GCM_SHA384', 'TLS_CHACHA20_POLY1305_SHA256'];

test('with AES instructions AES-128-GCM comes first, without them ChaCha20; no suite is dropped', (t) => {
  t.deepEqual(tls13Suites(true).split(':'), ['TLS_AES_128_GCM_SHA256', 'TLS_AES_256_GCM_SHA384', 'TLS_CHACHA20_POLY1305_SHA256']);
  t.deepEqual(tls13Suites(false).split(':'), ['TLS_CHACHA20_POLY1305_SHA256', 'TLS_AES_128_GCM_SHA256', 'TLS_AES_256_GCM_SHA384']);
  t.deepEqual([...tls13Suites(false).split(':')].sort(), [...ALL_TLS13].sort());
});

test("the default list is that order, then Node's TLS 1.2 suites unchanged", (t) => {
  const list = defaultCipherList().split(':');
  t.deepEqual(list.slice(0, 3), tls13Suites().split(':'));
  t.deepEqual(list.slice(3), tls.DEFAULT_CIPHERS.split(':').filter((c) => !c.startsWith('TLS_')));
});

test("a server with the default list picks its first TLS 1.3 suite over a Node client's own first choice", async (t) => {
  const ca = await createCertificateAuthority('tls-flags test CA');
  const leaf = await ca.issue({ commonName: 'localhost', usage: 'server', ipAddresses: ['127.0.0.1'] });
  const server = tls.createServer({ cert: leaf.certPem, key: leaf.keyPem, ciphers: defaultCipherList() }, (s) => s.end());
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => void server.close());
  const port = (server.address() as { port: number }).port;
  const negotiated = await new Promise<string>((resolve, reject) => {
    const c = tls.connect({ host: '127.0.0.1', port, ca: ca.certPem }, () => {
      resolve(c.getCipher().name);
      c.destroy();
    });
    c.once('error', reject);
  });
  t.not(tls.DEFAULT_CIPHERS.split(':')[0], tls13Suites().split(':')[0], "Node's client prefers another suite");
  t.is(negotiated, tls13Suites().split(':')[0]);
});
