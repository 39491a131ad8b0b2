/**
 * Upstream's server --tls-min-version and --cipher-suites (Go's names),
 * mapped onto Node's TLS options for the agent port and the TCP frontend.
 * Below TLS 1.2 and the broken suites (RC4, 3DES) are refused, not served.
 */
import type { SecureVersion } from 'node:tls';
import { UsageError } from '../../common/usage-error.js';

export interface TlsPolicy {
  minVersion?: SecureVersion;
  /** OpenSSL cipher list: the chosen TLS 1.2 suites, then Node's TLS 1.3 ones (upstream: no effect on TLS 1.3). */
  ciphers?: string;
}

const MIN_VERSIONS: Record<string, SecureVersion | undefined> = { VersionTLS12: 'TLSv1.2', VersionTLS13: 'TLSv1.3' };

/** Go's crypto/tls names of the TLS 1.2 suites it considers secure, and OpenSSL's. */
const GO_CIPHER_SUITES: Record<string, string> = {
  TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256: 'ECDHE-ECDSA-AES128-GCM-SHA256',
  TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256: 'ECDHE-RSA-AES128-GCM-SHA256',
  TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384: 'ECDHE-ECDSA-AES256-GCM-SHA384',
  TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384: 'ECDHE-RSA-AES256-GCM-SHA384',
  TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305: 'ECDHE-ECDSA-CHACHA20-POLY1305',
  TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256: 'ECDHE-ECDSA-CHACHA20-POLY1305',
  TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305: 'ECDHE-RSA-CHACHA20-POLY1305',
  TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256: 'ECDHE-RSA-CHACHA20-POLY1305',
  TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA: 'ECDHE-ECDSA-AES128-SHA',
  TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA: 'ECDHE-RSA-AES128-SHA',
  TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA: 'ECDHE-ECDSA-AES256-SHA',
  TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA: 'ECDHE-RSA-AES256-SHA',
  TLS_RSA_WITH_AES_128_GCM_SHA256: 'AES128-GCM-SHA256',
  TLS_RSA_WITH_AES_256_GCM_SHA384: 'AES256-GCM-SHA384',
  TLS_RSA_WITH_AES_128_CBC_SHA: 'AES128-SHA',
  TLS_RSA_WITH_AES_256_CBC_SHA: 'AES256-SHA',
};

const TLS13_SUITES = 'TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256:TLS_AES_128_GCM_SHA256';

/** `--tls-min-version`: Go's name to Node's; empty keeps Node's default (TLS 1.2). */
export function minVersionFlag(minVersion: string, flag: string): TlsPolicy['minVersion'] {
  if (minVersion === '') return undefined;
  const v = MIN_VERSIONS[minVersion];
  if (!v) {
    const below = minVersion === 'VersionTLS10' || minVersion === 'VersionTLS11';
    throw new UsageError(
      `--${flag} ${JSON.stringify(minVersion)}: ${below ? 'Kanal serves TLS 1.2 or newer only; ' : ''}use VersionTLS12 or VersionTLS13`,
    );
  }
  return v;
}

/** `--cipher-suites` (repeatable, comma-separated Go names) as an OpenSSL list; none keeps Node's. */
export function cipherSuitesFlag(cipherSuites: readonly string[], flag: string): TlsPolicy['ciphers'] {
  const names = cipherSuites
    .flatMap((s) => s.split(','))
    .map((s) => s.trim())
    .filter((s) => s !== '');
  if (names.length === 0) return undefined;
  const openssl = names.map((n) => {
    const o = GO_CIPHER_SUITES[n];
    if (!o)
      throw new UsageError(
        `--${flag}: ${JSON.stringify(n.slice(0, 60))} is not a TLS 1.2 suite Kanal serves; choose from ${Object.keys(GO_CIPHER_SUITES).join(', ')}`,
      );
    return o;
  });
  return [...new Set(openssl), TLS13_SUITES].join(':');
}
