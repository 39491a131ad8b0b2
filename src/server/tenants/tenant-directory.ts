/**
 * Whose a connection is, on a server of many tenants (docs/multi-tenant.md,
 * "Recognition"). Built whole from the loaded tenants and replaced whole on
 * a reload, so a decision never sees half of a change.
 *
 * Agent port, in order: (1) a TLS server name (SNI) that one tenant lists
 * picks it: its certificate is presented, and a client certificate must be
 * issued by its CA and match its pins; (2) else the client certificate: the
 * tenants whose CA issued it and whose pins it matches, exactly one; (3) else
 * a token-only agent: the tenant whose token-issuer is its token's `iss`
 * (the token then goes to that tenant's kube-apiserver alone). The TCP
 * frontend: the tenant whose server-ca-cert issued the kube-apiserver's
 * client certificate and whose pins it matches, exactly one.
 */
import tls from 'node:tls';
import { createHash, X509Certificate } from 'node:crypto';
import type { RefusalReason } from '../../domain/refusal-reason.js';
import { certificateCredential, type AgentConnection } from '../identity/agent-credential.js';
import { ClientRoles, parseBundle, type RolePins } from '../identity/client-roles.js';
import { anchorPath, chainRefusal, issued } from '../identity/certificate-chain.js';

/** What the directory needs of one tenant: its name, recognition settings and credentials (read and checked). */
export interface TenantCredentials {
  name: string;
  serverNames: readonly string[];
  /** The pair presented for serverNames. */
  serving?: { cert: Buffer; key: Buffer };
  agentCa?: Buffer;
  agentPins: RolePins;
  frontendCa?: Buffer;
  frontendPins: RolePins;
  tokenIssuer?: string;
  /** Agents authenticate with tokens (reviewed by the tenant's service): a certificate is then optional. */
  tokens: boolean;
}

/** Whose a TLS connection is (and who authenticated it), or why it is refused: what the listeners act on. */
export type Recognition<C> =
  | { ok: true; connection: C; identity: string }
  | { ok: false; reason: RefusalReason; what: string; detail: string; fields?: Record<string, unknown> };

/** One CA certificate and every tenant that trusts it, each with the path from it to its bundle's root. */
interface CaEntry {
  ca: X509Certificate;
  tenants: Map<string, X509Certificate[]>;
}

/** Which tenants verified a certificate, and why the others (for the server's log). */
interface Issuers {
  tenants: string[];
  refusal?: string;
}

/**
 * The trust index of one role: issuing certificate's subject -> the distinct
 * CA certificates with that subject (by fingerprint) -> the tenants trusting
 * each. A certificate costs one signature check per distinct CA of its
 * issuer's name, however many tenants share that CA. The index verifies the
 * chain itself (certificate-chain.ts): no listener of a shared server hands
 * OpenSSL a trust store, whose names the CertificateRequest would carry.
 */
class CaIndex {
  private readonly bySubject = new Map<string, Map<string, CaEntry>>();

  /** `parse`: a bundle's certificates (the directory keeps them across reloads). */
  constructor(
    private readonly parse: (bundle: Buffer) => X509Certificate[],
    private readonly now: () => number,
  ) {}

  add(tenant: string, bundle: Buffer): void {
    const certs = this.parse(bundle);
    for (const ca of certs) {
      // A certificate that chains to no self-signed one of the bundle anchors nothing (as in OpenSSL without partial chains).
      const path = anchorPath(ca, certs);
      if (!path) continue;
      const cas = this.bySubject.get(ca.subject) ?? new Map<string, CaEntry>();
      const entry = cas.get(ca.fingerprint256) ?? { ca, tenants: new Map<string, X509Certificate[]>() };
      entry.tenants.set(tenant, path);
      cas.set(ca.fingerprint256, entry);
      this.bySubject.set(ca.subject, cas);
    }
  }

  /** Every tenant under one of whose CA certificates `cert` is a valid client certificate now (a real chain check, not names alone). */
  issuers(cert: X509Certificate): Issuers {
    const out = new Set<string>();
    let refusal: string | undefined;
    const now = this.now();
    for (const { ca, tenants } of this.bySubject.get(cert.issuer)?.values() ?? []) {
      if (!issued(ca, cert)) continue;
      for (const [t, path] of tenants) {
        const why = chainRefusal(cert, path, now);
        if (why === undefined) out.add(t);
        else refusal ??= why;
      }
    }
    return { tenants: [...out], ...(refusal !== undefined ? { refusal } : {}) };
  }
}

/** The parts of TLS options the directory's contexts share with the listener (--tls-min-version, --cipher-suites). */
export type TlsPolicyOptions = Pick<tls.SecureContextOptions, 'minVersion' | 'ciphers'>;

/** SHA-256 of some credential bytes, as a cache key. */
function digest(...parts: (Buffer | string)[]): string {
  const h = createHash('sha256');
  for (const p of parts) h.update(p).update('\0');
  return h.digest('hex');
}

/**
 * The client's certificate as sent, not yet trusted: the listener's context
 * may hold no trust store (the index verifies), or another tenant's.
 */
function presentedCertificate(socket: tls.TLSSocket): X509Certificate | undefined {
  const { raw } = socket.getPeerCertificate();
  return raw ? new X509Certificate(raw) : undefined;
}

const names = (list: readonly string[]): string => list.map((n) => JSON.stringify(n)).join(' and ');

export class TenantDirectory {
  private readonly byServerName = new Map<string, { tenant: TenantCredentials; context: tls.SecureContext }>();
  private readonly tenants = new Map<string, TenantCredentials>();
  private readonly agentCas: CaIndex;
  private readonly frontendCas: CaIndex;
  private readonly issuers = new Map<string, string>();
  /** Each tenant's role pins, made once. */
  private readonly roles = new Map<string, ClientRoles>();

  /** TLS contexts and parsed CA bundles by their content's digest, kept from one directory to the next (a reload rebuilds only what changed). */
  private readonly contexts = new Map<string, tls.SecureContext>();
  private readonly bundles = new Map<string, X509Certificate[]>();

  /** `previous`: the directory this one replaces, whose TLS contexts and parsed bundles are taken over where nothing changed. */
  constructor(list: readonly TenantCredentials[], policy: TlsPolicyOptions, previous?: TenantDirectory) {
    const parse = (bundle: Buffer): X509Certificate[] => {
      const key = digest(bundle);
      const certs = this.bundles.get(key) ?? previous?.bundles.get(key) ?? parseBundle(bundle);
      this.bundles.set(key, certs);
      return certs;
    };
    this.agentCas = new CaIndex(parse, Date.now);
    this.frontendCas = new CaIndex(parse, Date.now);
    for (const t of list) {
      this.tenants.set(t.name, t);
      this.roles.set(t.name, new ClientRoles(t.agentPins, t.frontendPins));
      if (t.agentCa) this.agentCas.add(t.name, t.agentCa);
      if (t.frontendCa) this.frontendCas.add(t.name, t.frontendCa);
      if (t.tokenIssuer !== undefined) this.issuers.set(t.tokenIssuer, t.name);
      if (t.serving) {
        const { cert, key } = t.serving;
        const id = digest(cert, key, t.agentCa ?? '', JSON.stringify(policy));
        // One context for every tenant with the same certificate, key and CA (a wildcard certificate shared by many).
        const context =
          this.contexts.get(id) ??
          previous?.contexts.get(id) ??
          tls.createSecureContext({ ...policy, cert, key, ...(t.agentCa ? { ca: t.agentCa } : {}) });
        this.contexts.set(id, context);
        for (const n of t.serverNames) this.byServerName.set(n, { tenant: t, context });
      }
    }
  }

  get size(): number {
    return this.tenants.size;
  }

  /** The agent port's context for a server name (SNICallback); undefined: the default one. */
  contextFor(serverName: string): tls.SecureContext | undefined {
    return this.byServerName.get(serverName.toLowerCase())?.context;
  }

  /**
   * Which tenant an agent connection is, once its handshake is done (see the
   * file's comment). The default context holds no trust store (its
   * CertificateRequest names no CA): the index verifies the certificate.
   */
  recogniseAgent(socket: tls.TLSSocket): Recognition<AgentConnection> {
    const sni = typeof socket.servername === 'string' ? socket.servername.toLowerCase() : undefined;
    const byName = sni === undefined ? undefined : this.byServerName.get(sni)?.tenant;
    const cert = presentedCertificate(socket);
    if (byName) return this.agentByServerName(byName, sni ?? '', cert, socket);
    if (cert) {
      const { tenants: owners, refusal } = this.agentCas.issuers(cert);
      const fitting = owners.filter((name) => this.pinsRefusal(name, cert, 'agent') === undefined);
      if (fitting.length === 1) {
        const credential = certificateCredential(cert);
        return { ok: true, connection: { tenant: fitting[0], credential }, identity: `certificate ${credential.subject}` };
      }
      if (fitting.length > 1)
        return {
          ok: false,
          reason: 'agent_tenant_ambiguous',
          what: 'its certificate fits several tenants',
          detail: `tenants ${names(fitting.slice(0, 3))} all accept ${certificateCredential(cert).subject}: give them server-name, or pins of their own`,
          fields: { tenants: fitting.slice(0, 10) },
        };
      if (this.issuers.size === 0) {
        const why = owners
          .slice(0, 3)
          .map((n) => `tenant ${JSON.stringify(n)}: ${this.pinsRefusal(n, cert, 'agent') ?? ''}`)
          .join('; ');
        return {
          ok: false,
          reason: 'agent_tenant_unknown',
          what: 'its certificate fits no tenant',
          detail: why || `${certificateCredential(cert).subject}: ${refusal ?? "issued by no tenant's cluster-ca-cert"}`,
          fields: { tenants: owners.slice(0, 10) },
        };
      }
    }
    // A token decides (its issuer names the tenant); without token tenants nothing can.
    if (this.issuers.size > 0) return { ok: true, connection: {}, identity: 'a token to name its tenant' };
    return {
      ok: false,
      reason: 'agent_tenant_unknown',
      what: 'it names no tenant',
      detail:
        sni === undefined
          ? `no server name (SNI) and ${cert ? 'a client certificate no tenant trusts' : 'no client certificate'}`
          : `server name ${JSON.stringify(sni)} is no tenant's, and ${cert ? 'its client certificate fits no tenant' : 'no client certificate'}`,
      fields: sni === undefined ? {} : { serverName: sni },
    };
  }

  private agentByServerName(
    tenant: TenantCredentials,
    sni: string,
    cert: X509Certificate | undefined,
    socket: tls.TLSSocket,
  ): Recognition<AgentConnection> {
    const name = tenant.name;
    // This name's context trusts only this tenant's CA, so OpenSSL checked the chain; the index checks it again: the
    // handshake may have run under the directory before a reload, whose context for this name was another.
    const owners = cert && tenant.agentCa ? this.agentCas.issuers(cert) : { tenants: [] };
    if (cert && socket.authorized && owners.tenants.includes(name)) {
      const misfit = this.pinsRefusal(name, cert, 'agent');
      if (misfit === undefined) {
        const credential = certificateCredential(cert);
        return { ok: true, connection: { tenant: name, credential }, identity: `server name ${sni}, certificate ${credential.subject}` };
      }
      return {
        ok: false,
        reason: 'agent_tenant_mismatch',
        what: `its certificate is not tenant ${JSON.stringify(name)}'s`,
        detail: misfit,
        fields: { tenant: name },
      };
    }
    if (cert && tenant.agentCa) {
      // Not trusted by this tenant's CA: whose is it?
      const theirs = owners.tenants.filter((n) => n !== name);
      return {
        ok: false,
        reason: 'agent_tenant_mismatch',
        what: `server name ${JSON.stringify(sni)} is tenant ${JSON.stringify(name)}'s, the certificate is not`,
        detail:
          theirs.length > 0
            ? `issued by the CA of tenant ${names(theirs)}`
            : String(socket.authorizationError ?? owners.refusal ?? 'untrusted'),
        fields: { tenant: name, ...(theirs.length > 0 ? { certificateTenants: theirs } : {}) },
      };
    }
    if (tenant.tokens && !tenant.agentCa)
      return { ok: true, connection: { tenant: name }, identity: `server name ${sni}, a token to come` };
    return {
      ok: false,
      reason: 'agent_tenant_mismatch',
      what: `tenant ${JSON.stringify(name)} needs a client certificate`,
      detail: 'no client certificate presented',
      fields: { tenant: name },
    };
  }

  /** Why tenant `name`, whose CA issued `cert`, does not take it in `role` (its pins, the other role's pins), or undefined. */
  private pinsRefusal(name: string, cert: X509Certificate, role: 'agent' | 'frontend'): string | undefined {
    const roles = this.roles.get(name);
    return roles ? roles.refusal(cert, role) : `no tenant ${JSON.stringify(name)}`;
  }

  /** Which tenant's kube-apiserver a TCP frontend connection is (the listener holds no trust store: the index verifies). */
  recogniseFrontend(socket: tls.TLSSocket): Recognition<{ tenant: string }> {
    const cert = presentedCertificate(socket);
    const { tenants: owners, refusal } = cert ? this.frontendCas.issuers(cert) : { tenants: [], refusal: undefined };
    if (!cert || owners.length === 0)
      return {
        ok: false,
        reason: 'frontend_certificate',
        what: 'no valid client certificate',
        detail: cert
          ? `${certificateCredential(cert).subject}: ${refusal ?? "issued by no tenant's server-ca-cert"}`
          : 'no client certificate presented',
      };
    const subject = certificateCredential(cert).subject;
    // Roles never mix: a certificate some tenant takes as an agent's never opens a frontend.
    const asAgent = this.agentCas.issuers(cert).tenants.filter((n) => this.pinsRefusal(n, cert, 'agent') === undefined);
    if (asAgent.length > 0)
      return {
        ok: false,
        reason: 'frontend_role',
        what: 'not a frontend credential',
        detail: `${subject} is an agent credential of tenant ${names(asAgent.slice(0, 3))}`,
        fields: { tenants: asAgent.slice(0, 10) },
      };
    const fitting = owners.filter((n) => this.pinsRefusal(n, cert, 'frontend') === undefined);
    if (fitting.length === 1) return { ok: true, connection: { tenant: fitting[0] }, identity: `certificate ${subject}` };
    if (fitting.length > 1)
      return {
        ok: false,
        reason: 'frontend_tenant_ambiguous',
        what: 'its certificate fits several tenants',
        detail: `tenants ${names(fitting)} both accept ${subject}: pin each with frontend-client-subject`,
        fields: { tenants: fitting.slice(0, 10) },
      };
    return {
      ok: false,
      reason: 'frontend_tenant_unknown',
      what: 'its certificate fits no tenant',
      detail: `${subject} matches no pins of tenant ${names(owners.slice(0, 3))}${owners.length > 3 ? ` (and ${owners.length - 3} more)` : ''}`,
      fields: { tenants: owners.slice(0, 10) },
    };
  }

  /** Whether a token's issuer can name a tenant (some tenant has a token-issuer). */
  hasTokenIssuers(): boolean {
    return this.issuers.size > 0;
  }

  /** The tenant whose token-issuer is the (not yet reviewed) token's `iss`; its review decides. */
  tenantOfToken(authorization: readonly string[]): string | undefined {
    if (authorization.length !== 1) return undefined;
    const m = /^Bearer ([A-Za-z0-9_-]+)\.([A-Za-z0-9_-]{1,8192})\.[A-Za-z0-9_-]*$/.exec(authorization[0]);
    if (!m) return undefined;
    try {
      const claims: unknown = JSON.parse(Buffer.from(m[2], 'base64url').toString('utf8'));
      const iss: unknown = typeof claims === 'object' && claims !== null ? Reflect.get(claims, 'iss') : undefined;
      return typeof iss === 'string' ? this.issuers.get(iss) : undefined;
    } catch {
      return undefined;
    }
  }
}
