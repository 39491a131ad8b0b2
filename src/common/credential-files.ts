/**
 * Credential files (certificates, keys, CA bundles, tokens) read and checked
 * once at start, with messages that name the flag, the path and the cause
 * (docs/operations.md, "Start-up checks"). What TLS would otherwise say later is an OpenSSL code
 * ("key values mismatch", "DECODER routines::unsupported") or nothing at all
 * (a CA file without a certificate is accepted and every peer refused).
 *
 * A problem in a file's content is permanent: the command exits instead of
 * retrying. A certificate outside its validity period is only a warning: the
 * clock may still be wrong at boot, and the peer says so itself.
 */
import fs from 'node:fs';
import { X509Certificate, createPrivateKey, type KeyObject } from 'node:crypto';
import { errorMessage } from './error-message.js';

/** A file named by a flag, e.g. { flag: 'agent-key', path: '/etc/kanal/agent.key' }. */
export interface FlagFile {
  flag: string;
  path: string;
  /** Set for a file named in a settings file (e.g. 'tenant "alpha"'): the setting is then named without dashes. */
  where?: string;
}

/** One or more credential files are unusable; the message lists each (flag, path, cause). */
export class CredentialFilesError extends Error {
  override name = 'CredentialFilesError';
  constructor(readonly problems: readonly string[]) {
    super(problems.length === 1 ? problems[0] : `${problems.length} problems with credential files:\n  ${problems.join('\n  ')}`);
  }
}

/** A single file's problem, e.g. "--agent-key /etc/kanal/agent.key: cannot read (ENOENT: no such file)". */
export class CredentialFileError extends Error {
  override name = 'CredentialFileError';
  constructor(
    /** The flag naming the file at fault. */
    readonly flag: string,
    message: string,
  ) {
    super(message);
  }
}

const OID_SERVER_AUTH = '1.3.6.1.5.5.7.3.1';
const OID_CLIENT_AUTH = '1.3.6.1.5.5.7.3.2';
const OID_ANY_EKU = '2.5.29.37.0';

export type CertificatePurpose = 'client' | 'server';

export interface CertificateFile extends FlagFile {
  pem: Buffer;
  certs: X509Certificate[];
}

export interface KeyFile extends FlagFile {
  pem: Buffer;
  key: KeyObject;
}

function label(file: FlagFile): string {
  return file.where ? `${file.where}: ${file.flag} ${file.path}` : `--${file.flag} ${file.path}`;
}

function problem(file: FlagFile, cause: string): CredentialFileError {
  return new CredentialFileError(file.flag, `${label(file)}: ${cause}`);
}

export function readFlagFile(file: FlagFile): Buffer {
  try {
    return fs.readFileSync(file.path);
  } catch (err) {
    const e = err as NodeJS.ErrnoException;
    const why =
      e.code === 'ENOENT'
        ? 'no such file'
        : e.code === 'EACCES'
          ? `permission denied for uid ${process.getuid?.() ?? '?'}`
          : e.code === 'EISDIR'
            ? 'is a directory'
            : e.message;
    throw problem(file, `cannot read (${e.code ? `${e.code}: ` : ''}${why})`);
  }
}

function pemLabels(text: string): string[] {
  return [...text.matchAll(/-----BEGIN ([A-Z0-9 ]+)-----/g)].map((m) => m[1]);
}

function pemBlocks(text: string, label: RegExp): string[] {
  const out: string[] = [];
  for (const m of text.matchAll(/-----BEGIN ([A-Z0-9 ]+)-----[\s\S]*?-----END \1-----/g)) if (label.test(m[1])) out.push(m[0]);
  return out;
}

/** "CN=name" of a distinguished name as X509Certificate prints it (one RDN a line). */
export function commonName(dn: string): string {
  const cn = /(?:^|\n)CN=([^\n]*)/.exec(dn)?.[1];
  return cn ? `CN=${cn}` : dn.replace(/\n/g, ', ') || '(empty subject)';
}

/** A file with at least one PEM certificate, every one of which parses. */
export function loadCertificates(file: FlagFile): CertificateFile {
  const pem = readFlagFile(file);
  const text = pem.toString('utf8');
  const blocks = pemBlocks(text, /^(TRUSTED )?CERTIFICATE$/);
  if (blocks.length === 0) {
    const found = pemLabels(text);
    const what = found.length > 0 ? ` (found ${found.map((l) => `"${l}"`).join(', ')})` : '';
    throw problem(file, `no PEM certificate in the file (expected "-----BEGIN CERTIFICATE-----")${what}`);
  }
  const certs = blocks.map((block, i) => {
    try {
      return new X509Certificate(block);
    } catch (err) {
      throw problem(file, `certificate #${i + 1} does not parse (${errorMessage(err)})`);
    }
  });
  return { ...file, pem, certs };
}

/** A file with an unencrypted PEM private key. */
export function loadPrivateKey(file: FlagFile, certFlag: string): KeyFile {
  const pem = readFlagFile(file);
  const labels = pemLabels(pem.toString('utf8'));
  if (labels.includes('ENCRYPTED PRIVATE KEY'))
    throw problem(file, 'the key is encrypted; Kanal needs it unencrypted (protect it with file permissions)');
  if (!labels.some((l) => l.endsWith('PRIVATE KEY'))) {
    if (labels.some((l) => /CERTIFICATE$/.test(l)))
      throw problem(file, `holds a certificate, not a private key (are --${certFlag} and --${file.flag} swapped?)`);
    throw problem(file, 'no PEM private key in the file (expected "-----BEGIN PRIVATE KEY-----", or an RSA or EC one)');
  }
  try {
    return { ...file, pem, key: createPrivateKey(pem) };
  } catch (err) {
    throw problem(file, `the private key does not parse (${errorMessage(err)})`);
  }
}

/** Why the first certificate cannot serve `purpose` (extended key usage), or undefined. */
function purposeProblem(cert: X509Certificate, purpose: CertificatePurpose): string | undefined {
  const eku = cert.keyUsage;
  const oid = purpose === 'client' ? OID_CLIENT_AUTH : OID_SERVER_AUTH;
  if (!eku || eku.length === 0 || eku.includes(oid) || eku.includes(OID_ANY_EKU)) return undefined;
  return `${commonName(cert.subject)} is not a ${purpose} certificate (its extended key usage lacks ${purpose}Auth)`;
}

/** Throws when `key` does not belong to `cert`'s first certificate or that certificate cannot serve `purpose`. */
export function checkKeyPair(cert: CertificateFile, key: KeyFile, purpose: CertificatePurpose): void {
  if (!cert.certs[0].checkPrivateKey(key.key)) throw problem(key, `does not belong to ${label(cert)} (the public keys differ)`);
  const wrong = purposeProblem(cert.certs[0], purpose);
  if (wrong) throw problem(cert, wrong);
}

/** A bearer token file: readable and not empty. */
export function loadToken(file: FlagFile): string {
  const token = readFlagFile(file).toString('utf8').trim();
  if (!token) throw problem(file, 'the file is empty');
  return token;
}

/** Why `cert` is not valid at `now`, or undefined. */
export function validityProblem(cert: X509Certificate, now: Date): string | undefined {
  const from = new Date(cert.validFrom);
  const to = new Date(cert.validTo);
  if (now < from) return `not valid before ${from.toISOString()}`;
  if (now > to) return `expired on ${to.toISOString()}`;
  return undefined;
}

/** Warnings for certificates outside their validity period (see the module comment for why not errors). */
export function validityWarnings(file: CertificateFile, now: Date = new Date()): string[] {
  const out: string[] = [];
  for (const cert of file.certs) {
    const bad = validityProblem(cert, now);
    if (bad) out.push(`${label(file)}: ${commonName(cert.subject)} is ${bad}`);
  }
  return out;
}

/**
 * Loads a command's credential files, collecting each file's problem rather
 * than stopping at the first, so one start shows everything to fix.
 */
export class CredentialCheck {
  readonly problems: string[] = [];
  readonly warnings: string[] = [];

  constructor(private readonly now: Date = new Date()) {}

  certificates(file: FlagFile): CertificateFile | undefined {
    const loaded = this.run(() => loadCertificates(file));
    if (loaded) this.warnings.push(...validityWarnings(loaded, this.now));
    return loaded;
  }

  /** A certificate and the key that belongs to it, fit for `purpose`. */
  keyPair(certFile: FlagFile, keyFile: FlagFile, purpose: CertificatePurpose): { cert: CertificateFile; key: KeyFile } | undefined {
    const cert = this.certificates(certFile);
    const key = this.run(() => loadPrivateKey(keyFile, certFile.flag));
    if (!cert || !key) return undefined;
    const before = this.problems.length;
    this.run(() => checkKeyPair(cert, key, purpose));
    return this.problems.length === before ? { cert, key } : undefined;
  }

  token(file: FlagFile): string | undefined {
    return this.run(() => loadToken(file));
  }

  /** Throws CredentialFilesError when any file was unusable. */
  done(): void {
    if (this.problems.length > 0) throw new CredentialFilesError(this.problems);
  }

  /** The loader's result, or undefined after recording its problem. */
  private run<T>(load: () => T): T | undefined {
    try {
      return load();
    } catch (err) {
      if (!(err instanceof CredentialFileError)) throw err;
      this.problems.push(err.message);
      return undefined;
    }
  }
}
