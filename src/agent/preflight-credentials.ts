/** `--check`: the agent's credential files (CA, certificate and key, token) readable, parsed, valid now. */
import type { X509Certificate } from 'node:crypto';
import {
  CredentialFileError,
  checkKeyPair,
  commonName,
  loadCertificates,
  loadPrivateKey,
  loadToken,
  validityProblem,
  type CertificateFile,
} from '../common/credential-files.js';

import type { CheckResult } from './preflight-options.js';
import { agentSettings, FLAG } from './settings.js';
import { keyOf } from '../settings/flag-names.js';

/** The check's result for one loader: pass with `detail(value)`, or fail with the loader's message (flag, path, cause). */
export function fileCheck<T>(name: string, load: () => T, detail: (value: T) => CheckResult): { result: CheckResult; value?: T } {
  try {
    const value = load();
    return { result: detail(value), value };
  } catch (err) {
    if (!(err instanceof CredentialFileError)) throw err;
    return { result: { name, status: 'fail', detail: err.message } };
  }
}

export function validUntil(cert: X509Certificate): string {
  return `valid until ${new Date(cert.validTo).toISOString()}`;
}

export function checkCa(path: string | undefined, now: Date): { result: CheckResult; value?: CertificateFile } {
  const name = keyOf(agentSettings, 'ca-cert');
  if (!path) return { result: { name, status: 'fail', detail: `${FLAG['ca-cert']} is not set` } };
  return fileCheck(
    name,
    () => loadCertificates({ flag: name, path }),
    (ca) => {
      const valid = ca.certs.filter((c) => validityProblem(c, now) === undefined);
      if (valid.length === 0) {
        const why = ca.certs.map((c) => `${commonName(c.subject)} ${validityProblem(c, now)}`).join('; ');
        return { name, status: 'fail', detail: `${path}: no currently valid certificate (${why})` };
      }
      return {
        name,
        status: 'pass',
        detail: `${path}: ${ca.certs.length} certificate(s), ${commonName(valid[0].subject)} ${validUntil(valid[0])}`,
      };
    },
  );
}

export interface ClientCredentials {
  results: CheckResult[];
  ok: boolean;
}

export function checkClientCertAndKey(certPath: string, keyPath: string, now: Date): ClientCredentials {
  const certFile = { flag: keyOf(agentSettings, 'agent-cert'), path: certPath };
  const keyFile = { flag: keyOf(agentSettings, 'agent-key'), path: keyPath };
  const cert = fileCheck(
    certFile.flag,
    () => loadCertificates(certFile),
    (c): CheckResult => {
      const first = c.certs[0];
      const bad = validityProblem(first, now);
      if (bad) return { name: certFile.flag, status: 'fail', detail: `${certPath}: ${commonName(first.subject)} is ${bad}` };
      return {
        name: certFile.flag,
        status: 'pass',
        detail: `${certPath}: ${commonName(first.subject)}, issued by ${commonName(first.issuer)}, ${validUntil(first)}`,
      };
    },
  );
  const key = fileCheck(
    keyFile.flag,
    () => loadPrivateKey(keyFile, certFile.flag),
    (k): CheckResult => ({ name: keyFile.flag, status: 'pass', detail: `${keyPath}: ${k.key.asymmetricKeyType ?? 'private'} key` }),
  );
  const results = [cert.result, key.result];
  if (cert.value && key.value && cert.result.status === 'pass') {
    try {
      checkKeyPair(cert.value, key.value, 'client');
      results[1] = { ...results[1], detail: `${results[1].detail}, matches ${certPath}` };
    } catch (err) {
      if (!(err instanceof CredentialFileError)) throw err;
      const which = err.flag === keyFile.flag ? 1 : 0;
      results[which] = { ...results[which], status: 'fail', detail: err.message };
    }
  }
  return { results, ok: results.every((r) => r.status === 'pass') };
}

export function checkToken(path: string): CheckResult {
  return fileCheck(
    'token',
    () => loadToken({ flag: keyOf(agentSettings, 'service-account-token-path'), path }),
    (token) => ({ name: 'token', status: 'pass', detail: `${path}: ${token.length} bytes` }),
  ).result;
}
