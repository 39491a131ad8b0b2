/**
 * The client-certificate check a shared server does itself
 * (src/server/identity/certificate-chain.ts), since its listeners hold no
 * trust store: each case is one OpenSSL's verification refuses too.
 * Certificates made with the openssl CLI (intermediates, a non-CA issuer,
 * a forged CA of the same name).
 */
import test from 'ava';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { X509Certificate } from 'node:crypto';
import { run } from '../../kit/launch/run-to-end.js';
import { anchorPath, chainRefusal } from '../../src/server/identity/certificate-chain.js';

interface Made {
  cert: X509Certificate;
  crt: string;
  key: string;
}

const DAY = 86_400_000;

test('a client certificate is valid only under a real chain: issuer, signature, dates, CA flags, client EKU, a self-signed root', async (t) => {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'kanal-chain-'));
  t.teardown(() => fs.rm(dir, { recursive: true, force: true }));
  const make = async (name: string, ext: string, issuer?: Made): Promise<Made> => {
    const key = path.join(dir, `${name}.key`);
    const crt = path.join(dir, `${name}.crt`);
    const extFile = path.join(dir, `${name}.ext`);
    await fs.writeFile(extFile, `[e]\n${ext}\n`);
    const keyed = await run('openssl', ['genpkey', '-algorithm', 'EC', '-pkeyopt', 'ec_paramgen_curve:P-256', '-out', key]);
    t.is(keyed.code, 0, keyed.stderr);
    const csr = path.join(dir, `${name}.csr`);
    const req = await run('openssl', ['req', '-new', '-key', key, '-subj', `/CN=${name}`, '-out', csr]);
    t.is(req.code, 0, req.stderr);
    const sign = issuer ? ['-CA', issuer.crt, '-CAkey', issuer.key, '-CAcreateserial'] : ['-signkey', key];
    const signed = await run('openssl', [
      'x509',
      '-req',
      '-in',
      csr,
      ...sign,
      '-days',
      '30',
      '-extfile',
      extFile,
      '-extensions',
      'e',
      '-out',
      crt,
    ]);
    t.is(signed.code, 0, signed.stderr);
    return { cert: new X509Certificate(await fs.readFile(crt)), crt, key };
  };
  const CA = 'basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign\nsubjectKeyIdentifier=hash';
  const CLIENT = 'basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth';
  const root = await make('root', CA);
  const inter = await make('inter', `${CA}\nauthorityKeyIdentifier=keyid`, root);
  const leaf = await make('leaf', CLIENT, inter);
  const serverOnly = await make('server-only', 'basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth', inter);
  const forgedInter = await make('inter', CA); // same name, another key, self-signed
  const forged = await make('forged', CLIENT, forgedInter);
  const notCa = await make('not-a-ca', 'basicConstraints=CA:FALSE');
  const underNotCa = await make('under-not-a-ca', CLIENT, notCa);
  const now = Date.now();

  t.deepEqual(anchorPath(root.cert, [root.cert])?.length, 1, 'a root anchors itself');
  t.is(anchorPath(inter.cert, [inter.cert]), undefined, 'an intermediate without its root anchors nothing (no partial chains)');
  const path2 = anchorPath(inter.cert, [inter.cert, root.cert]);
  t.deepEqual(
    path2?.map((c) => c.subject),
    ['CN=inter', 'CN=root'],
  );
  if (!path2) return;
  t.is(chainRefusal(leaf.cert, path2, now), undefined, 'the honest leaf');
  t.is(chainRefusal(forged.cert, path2, now), 'not issued by a trusted CA', 'a CA of the same name does not vouch');
  t.regex(chainRefusal(serverOnly.cert, path2, now) ?? '', /not for client authentication/);
  t.regex(chainRefusal(leaf.cert, path2, now + 60 * DAY) ?? '', /expired/);
  t.regex(chainRefusal(leaf.cert, path2, now - 2 * DAY) ?? '', /not valid before/);
  const notCaPath = anchorPath(notCa.cert, [notCa.cert]);
  t.truthy(notCaPath, 'self-signed, so a path');
  if (notCaPath) t.regex(chainRefusal(underNotCa.cert, notCaPath, now) ?? '', /is not a CA/);
});
