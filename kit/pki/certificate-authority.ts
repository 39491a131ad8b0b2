/**
 * A tiny in-memory certificate authority for throwaway certificates (demo, tests).
 *
 * ECDSA P-256 keys, SHA-256 signatures, via @peculiar/x509 on Node's WebCrypto.
 * Not meant for production PKI: keys live in memory and are handed out as PEM.
 */
import { webcrypto, randomBytes } from 'node:crypto';
import { isIP } from 'node:net';
import 'reflect-metadata'; // before @peculiar/x509: its tsyringe dependency needs Reflect.getMetadata
import * as x509 from '@peculiar/x509';

type WebCrypto = webcrypto.Crypto;
type CryptoKey = webcrypto.CryptoKey;
type CryptoKeyPair = webcrypto.CryptoKeyPair;

const crypto: WebCrypto = webcrypto;
// @peculiar/x509's typings name the DOM `Crypto`, which this project's lib (no DOM) does not
// declare, so its parameter takes anything; Node's webcrypto is that object at runtime.
const x509Crypto = crypto;

const KEY_ALGORITHM: webcrypto.EcKeyGenParams = { name: 'ECDSA', namedCurve: 'P-256' };
const SIGNING_ALGORITHM: webcrypto.EcdsaParams = { name: 'ECDSA', hash: 'SHA-256' };
const DAY_MS = 24 * 60 * 60 * 1000;
const BACKDATE_MS = 60 * 1000;

export type CertificateUsage = 'server' | 'client' | 'both';

export interface IssueOptions {
  commonName: string;
  /** DNS subjectAltName entries. */
  dnsNames?: string[];
  /** IP subjectAltName entries (IPv4 or IPv6 literals). */
  ipAddresses?: string[];
  usage: CertificateUsage;
  /** More extended key usage OIDs, e.g. a private one that pins a role (docs/trust-model.md). */
  extraExtendedKeyUsages?: string[];
  /** Validity in days from now (default 365). */
  validDays?: number;
}

export interface IssuedCertificate {
  /** Leaf certificate, PEM. */
  certPem: string;
  /** Private key, PKCS#8 PEM ("BEGIN PRIVATE KEY"). */
  keyPem: string;
}

export interface CertificateAuthority {
  /** Self-signed CA certificate, PEM. */
  readonly certPem: string;
  /** CA private key, PKCS#8 PEM. */
  readonly keyPem: string;
  issue(options: IssueOptions): Promise<IssuedCertificate>;
}

export interface CreateCertificateAuthorityOptions {
  /** Validity in days from now (default 3650). */
  validDays?: number;
}

/** Create a self-signed ECDSA P-256 CA. */
export async function createCertificateAuthority(
  commonName: string,
  options: CreateCertificateAuthorityOptions = {},
): Promise<CertificateAuthority> {
  const keys = await generateKeyPair();
  const name = subjectName(commonName);
  const caCert = await x509.X509CertificateGenerator.createSelfSigned(
    {
      serialNumber: randomSerial(),
      name,
      ...validity(options.validDays ?? 3650),
      keys: keys,
      signingAlgorithm: SIGNING_ALGORITHM,
      extensions: [
        new x509.BasicConstraintsExtension(true, undefined, true),
        new x509.KeyUsagesExtension(
          x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign | x509.KeyUsageFlags.digitalSignature,
          true,
        ),
        await x509.SubjectKeyIdentifierExtension.create(keys.publicKey, false, x509Crypto),
        await x509.AuthorityKeyIdentifierExtension.create(keys.publicKey, false, x509Crypto),
      ],
    },
    x509Crypto,
  );
  return authority(caCert, keys, await exportPrivateKeyPem(keys.privateKey));
}

/** A CA written earlier by {@link createCertificateAuthority} (its certificate and PKCS#8 key, PEM). */
export async function loadCertificateAuthority(certPem: string, keyPem: string): Promise<CertificateAuthority> {
  const caCert = new x509.X509Certificate(certPem);
  const privateKey = await crypto.subtle.importKey('pkcs8', x509.PemConverter.decodeFirst(keyPem), KEY_ALGORITHM, true, ['sign']);
  const publicKey = (await caCert.publicKey.export(KEY_ALGORITHM, ['verify'], x509Crypto)) as unknown as CryptoKey;
  return authority(caCert, { privateKey, publicKey }, keyPem);
}

function authority(caCert: x509.X509Certificate, keys: CryptoKeyPair, keyPem: string): CertificateAuthority {
  const certPem = caCert.toString('pem');

  async function issue(opts: IssueOptions): Promise<IssuedCertificate> {
    const leafKeys = await generateKeyPair();
    const sanEntries: x509.JsonGeneralName[] = [
      ...(opts.dnsNames ?? []).map((value): x509.JsonGeneralName => ({ type: 'dns', value })),
      ...(opts.ipAddresses ?? []).map((value): x509.JsonGeneralName => {
        if (isIP(value) === 0) throw new Error(`not an IP address: ${value}`);
        return { type: 'ip', value };
      }),
    ];
    const extendedUsages: x509.ExtendedKeyUsageType[] = [];
    if (opts.usage === 'server' || opts.usage === 'both') extendedUsages.push(x509.ExtendedKeyUsage.serverAuth);
    if (opts.usage === 'client' || opts.usage === 'both') extendedUsages.push(x509.ExtendedKeyUsage.clientAuth);
    extendedUsages.push(...(opts.extraExtendedKeyUsages ?? []));

    const extensions: x509.Extension[] = [
      new x509.BasicConstraintsExtension(false, undefined, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature | x509.KeyUsageFlags.keyEncipherment, true),
      new x509.ExtendedKeyUsageExtension(extendedUsages, false),
      await x509.SubjectKeyIdentifierExtension.create(leafKeys.publicKey, false, x509Crypto),
      await x509.AuthorityKeyIdentifierExtension.create(keys.publicKey, false, x509Crypto),
    ];
    if (sanEntries.length > 0) extensions.push(new x509.SubjectAlternativeNameExtension(sanEntries, false));

    const leaf = await x509.X509CertificateGenerator.create(
      {
        serialNumber: randomSerial(),
        subject: subjectName(opts.commonName),
        issuer: caCert.subjectName,
        ...validity(opts.validDays ?? 365),
        publicKey: leafKeys.publicKey,
        signingKey: keys.privateKey,
        signingAlgorithm: SIGNING_ALGORITHM,
        extensions,
      },
      x509Crypto,
    );
    return { certPem: leaf.toString('pem'), keyPem: await exportPrivateKeyPem(leafKeys.privateKey) };
  }

  return { certPem, keyPem, issue };
}

async function generateKeyPair(): Promise<CryptoKeyPair> {
  return crypto.subtle.generateKey(KEY_ALGORITHM, true, ['sign', 'verify']);
}

async function exportPrivateKeyPem(key: CryptoKey): Promise<string> {
  const der = await crypto.subtle.exportKey('pkcs8', key);
  return x509.PemConverter.encode(der, 'PRIVATE KEY');
}

function subjectName(commonName: string): x509.JsonName {
  return [{ CN: [commonName] }];
}

function validity(days: number): { notBefore: Date; notAfter: Date } {
  const now = Date.now();
  return { notBefore: new Date(now - BACKDATE_MS), notAfter: new Date(now + days * DAY_MS) };
}

/** 16 random bytes, positive and minimally encoded as a DER INTEGER (RFC 5280: ≤ 20 octets). */
function randomSerial(): string {
  const bytes = randomBytes(16);
  bytes[0] = (bytes[0] & 0x7f) | 0x40;
  return bytes.toString('hex');
}
