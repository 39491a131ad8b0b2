/**
 * Agent authentication by Kubernetes service account token (docs/kubernetes-api.md): the
 * agent's `authorization: Bearer <token>` is checked with a TokenReview
 * (authentication.k8s.io/v1) for `--authentication-audience`, and accepted
 * only when the API authenticated it, confirmed that audience in
 * status.audiences (the TokenReview contract for audience-aware callers) and
 * named exactly `system:serviceaccount:<--agent-namespace>:<--agent-service-account>`.
 *
 * Never throws: every outcome is an identity or a refusal whose reason says
 * what to fix. Refusals the agent cannot fix (the API down, slow, refusing
 * Kanal's own credentials, or our bounded queue full) are marked
 * `agentFault: false`: the stream should be refused as unavailable, not
 * unauthenticated.
 *
 * Positive results are cached for `cacheTtlMs` (default 10 s, the
 * kube-apiserver's own cache time for successful token authentication), never
 * past the token's expiry, keyed by the token's SHA-256: an agent reconnecting
 * to every server, or flapping, costs one review, while a revoked token stops
 * opening new streams within the TTL. Refusals the agent's token earned
 * (rejected, wrong audience or identity) are remembered for
 * `refusalCacheTtlMs` (default 5 s), so a misconfigured DaemonSet that
 * reconnects in a loop costs one review per token and interval. Concurrent
 * checks of one token share one review, and one peer has at most
 * `maxReviewsPerPeer` reviews of its own in flight: a peer sending fresh junk
 * tokens cannot use up the client's review slots that other agents need (one
 * peer is bounded by what it alone may take).
 */
import { createHash } from 'node:crypto';
import { KubeApiError, type KubeApi } from '../../kube/kube-api.js';

// The settings these messages name, spelt once here: this module sits below the server's table (src/server/config/settings.ts) in the layers.
const AGENT_NAMESPACE = '--agent-namespace';
const AGENT_SERVICE_ACCOUNT = '--agent-service-account';
const AUTHENTICATION_AUDIENCE = '--authentication-audience';

/** `status.user.extra` keys the kube-apiserver sets for bound service account tokens. */
export const EXTRA_POD_NAME = 'authentication.kubernetes.io/pod-name';
export const EXTRA_POD_UID = 'authentication.kubernetes.io/pod-uid';
export const EXTRA_NODE_NAME = 'authentication.kubernetes.io/node-name';
export const EXTRA_CREDENTIAL_ID = 'authentication.kubernetes.io/credential-id';

export interface AgentTokenIdentity {
  /** `system:serviceaccount:<namespace>:<name>`. */
  username: string;
  /** The service account's uid. */
  uid: string;
  namespace: string;
  serviceAccount: string;
  /** Set for tokens bound to a pod (projected volumes). */
  podName?: string;
  podUid?: string;
  nodeName?: string;
  /** `JTI=...`: identifies this very token in audit logs. */
  credentialId?: string;
  /** The token's `exp`, when it is a JWT (read after the API vouched for it). */
  expiresAt?: Date;
}

export type TokenRefusalKind =
  /** No `authorization` metadata at all. */
  | 'no-token'
  /** Not exactly one `Bearer <token>`, or a token over the size bound. */
  | 'malformed'
  /** The API did not authenticate the token (unknown, expired, revoked, ...). */
  | 'rejected'
  /** Authenticated, but not for `--authentication-audience`. */
  | 'wrong-audience'
  /** Authenticated, but another service account (or not one). */
  | 'wrong-identity'
  /** The review could not be done: API down, slow, refusing us, or our queue full. */
  | 'unavailable';

export interface TokenRefusal {
  kind: TokenRefusalKind;
  /** One line an operator can act on; safe to send to the agent (no token inside). */
  reason: string;
  /** False when the agent's token is not the problem ({@link TokenRefusalKind} 'unavailable'). */
  agentFault: boolean;
}

export type TokenAuthentication = { ok: true; identity: AgentTokenIdentity; cached: boolean } | { ok: false; refusal: TokenRefusal };

export interface TokenAuthenticatorOptions {
  /** A client of its own is best: lease traffic then never queues behind a token storm. */
  api: KubeApi;
  /** `--agent-namespace`. */
  namespace: string;
  /** `--agent-service-account`. */
  serviceAccount: string;
  /** `--authentication-audience`. */
  audience: string;
  /** Deadline of one review, waiting for the client's slots and rate limit included (default 5 s). */
  reviewTimeoutMs?: number;
  /** How long an accepted token is remembered (default 10 s; 0: never). */
  cacheTtlMs?: number;
  /** Bound of the cache (default 10,000 tokens; the oldest are forgotten first). */
  maxCacheEntries?: number;
  /** Longer tokens are refused without a review (default 16 KiB; Kubernetes tokens are ~1 KiB). */
  maxTokenBytes?: number;
  /** How long a token's refusal is remembered (default 5 s; 0: never). Shares maxCacheEntries' bound. */
  refusalCacheTtlMs?: number;
  /** Reviews one peer (its address, without the port) may have in flight (default 2). */
  maxReviewsPerPeer?: number;
  now?: () => number;
}

export interface TokenAuthenticatorStats {
  reviews: number;
  cacheHits: number;
  cached: number;
  inFlight: number;
  refusals: Record<TokenRefusalKind, number>;
}

interface CacheEntry {
  identity: AgentTokenIdentity;
  until: number;
}

interface RefusalEntry {
  refusal: TokenRefusal;
  until: number;
}

/** Refusals that follow from the token itself, worth remembering; the others are about the API or the request. */
const TOKEN_REFUSALS: ReadonlySet<TokenRefusalKind> = new Set(['rejected', 'wrong-audience', 'wrong-identity']);

const SCHEME = /^Bearer\s+(.*)$/i;

export class TokenAuthenticator {
  readonly expectedUsername: string;
  private readonly reviewTimeoutMs: number;
  private readonly cacheTtlMs: number;
  private readonly maxCacheEntries: number;
  private readonly maxTokenBytes: number;
  private readonly refusalCacheTtlMs: number;
  private readonly maxReviewsPerPeer: number;
  private readonly now: () => number;
  /** Accepted tokens by SHA-256, least recently used first; never more than maxCacheEntries. */
  private readonly cache = new Map<string, CacheEntry>();
  /** Refused tokens by SHA-256, oldest first; never more than maxCacheEntries. */
  private readonly refused = new Map<string, RefusalEntry>();
  /** Reviews in flight by SHA-256; removed when they settle. */
  private readonly inFlight = new Map<string, Promise<TokenAuthentication>>();
  /** Reviews each peer started and that have not settled; no zero entries. */
  private readonly reviewsByPeer = new Map<string, number>();
  private readonly counts: TokenAuthenticatorStats = {
    reviews: 0,
    cacheHits: 0,
    cached: 0,
    inFlight: 0,
    refusals: { 'no-token': 0, malformed: 0, rejected: 0, 'wrong-audience': 0, 'wrong-identity': 0, unavailable: 0 },
  };

  constructor(private readonly options: TokenAuthenticatorOptions) {
    for (const [flag, value] of [
      [AGENT_NAMESPACE, options.namespace],
      [AGENT_SERVICE_ACCOUNT, options.serviceAccount],
      [AUTHENTICATION_AUDIENCE, options.audience],
    ] as const) {
      if (!value) throw new RangeError(`${flag} must not be empty for token authentication`);
      if (flag !== AUTHENTICATION_AUDIENCE && value.includes(':'))
        throw new RangeError(`${flag} ${JSON.stringify(value)} must not contain ':'`);
    }
    this.expectedUsername = `system:serviceaccount:${options.namespace}:${options.serviceAccount}`;
    this.reviewTimeoutMs = options.reviewTimeoutMs ?? 5000;
    this.cacheTtlMs = options.cacheTtlMs ?? 10_000;
    this.maxCacheEntries = options.maxCacheEntries ?? 10_000;
    this.maxTokenBytes = options.maxTokenBytes ?? 16 * 1024;
    this.refusalCacheTtlMs = options.refusalCacheTtlMs ?? 5000;
    this.maxReviewsPerPeer = options.maxReviewsPerPeer ?? 2;
    this.now = options.now ?? Date.now;
  }

  /** The Kubernetes API it reviews with (frontend clients' service-account tokens are reviewed with it too). */
  get api(): KubeApi {
    return this.options.api;
  }

  /** `--authentication-audience`. */
  get audience(): string {
    return this.options.audience;
  }

  stats(): TokenAuthenticatorStats {
    return { ...this.counts, cached: this.cache.size, inFlight: this.inFlight.size, refusals: { ...this.counts.refusals } };
  }

  /**
   * Checks the values of an agent stream's `authorization` metadata; `peer`
   * (the agent's address without its port; '' for none) bounds its reviews in flight.
   */
  async authenticate(authorization: readonly string[], peer = ''): Promise<TokenAuthentication> {
    if (authorization.length === 0) {
      return this.refuse(
        'no-token',
        'no service account token: the agent sent no authorization metadata (set --service-account-token-path on the agent)',
      );
    }
    if (authorization.length > 1)
      return this.refuse('malformed', `${authorization.length} authorization values; send exactly one "Bearer <token>"`);
    const token = SCHEME.exec(authorization[0])?.[1]?.trim();
    if (token === undefined) return this.refuse('malformed', 'authorization metadata is not "Bearer <token>"');
    if (token === '') return this.refuse('malformed', 'empty bearer token');
    if (Buffer.byteLength(token) > this.maxTokenBytes)
      return this.refuse('malformed', `bearer token longer than ${this.maxTokenBytes} bytes`);
    return this.authenticateToken(token, peer);
  }

  private async authenticateToken(token: string, peer: string): Promise<TokenAuthentication> {
    const key = createHash('sha256').update(token).digest('hex');
    const hit = this.cache.get(key);
    if (hit) {
      this.cache.delete(key);
      if (hit.until > this.now()) {
        this.cache.set(key, hit);
        this.counts.cacheHits++;
        return { ok: true, identity: hit.identity, cached: true };
      }
    }
    const refused = this.refused.get(key);
    if (refused) {
      if (refused.until > this.now()) return this.refuse(refused.refusal.kind, refused.refusal.reason);
      this.refused.delete(key);
    }
    const joined = this.inFlight.get(key);
    if (joined) return joined;
    const started = this.reviewsByPeer.get(peer) ?? 0;
    if (peer && started >= this.maxReviewsPerPeer) {
      return this.refuse('unavailable', `${started} token reviews from ${peer} are still in flight (the limit); retry`, false);
    }
    if (peer) this.reviewsByPeer.set(peer, started + 1);
    const pending = this.review(token, key).finally(() => {
      this.inFlight.delete(key);
      if (!peer) return;
      const left = (this.reviewsByPeer.get(peer) ?? 1) - 1;
      if (left > 0) this.reviewsByPeer.set(peer, left);
      else this.reviewsByPeer.delete(peer);
    });
    this.inFlight.set(key, pending);
    const result = await pending;
    if (!result.ok && TOKEN_REFUSALS.has(result.refusal.kind)) this.rememberRefusal(key, result.refusal);
    return result;
  }

  private async review(token: string, key: string): Promise<TokenAuthentication> {
    const { api, audience } = this.options;
    this.counts.reviews++;
    let status;
    try {
      const review = await api.call(
        `TokenReview for audience ${audience}`,
        (options) =>
          api.authentication.createTokenReview(
            { body: { apiVersion: 'authentication.k8s.io/v1', kind: 'TokenReview', spec: { token, audiences: [audience] } } },
            options,
          ),
        { timeoutMs: this.reviewTimeoutMs },
      );
      status = review.status;
    } catch (err) {
      const reason = err instanceof KubeApiError ? err.message : `TokenReview failed: ${String(err)}`;
      return this.refuse('unavailable', `cannot check the token: ${reason}`, false);
    }
    if (!status?.authenticated) {
      const said = status?.error ? `: ${status.error}` : '';
      const claimed = jwtClaims(token)?.aud;
      if (claimed && !claimed.includes(audience)) {
        return this.refuse(
          'wrong-audience',
          `the token is for audiences ${JSON.stringify(claimed)}, this server requires ${JSON.stringify(audience)} (${AUTHENTICATION_AUDIENCE}; the audience of the agent's projected token)${said}`,
        );
      }
      return this.refuse('rejected', `the Kubernetes API did not authenticate the token${said}`);
    }
    if (!(status.audiences ?? []).includes(audience)) {
      return this.refuse(
        'wrong-audience',
        `the Kubernetes API authenticated the token, but not for audience ${JSON.stringify(audience)} (it answered ${JSON.stringify(status.audiences ?? [])}): the token's audience or the API server's audience support is wrong`,
      );
    }
    const username = status.user?.username ?? '';
    if (username !== this.expectedUsername) {
      const sa = /^system:serviceaccount:([^:]+):([^:]+)$/.exec(username);
      const who = sa ? `service account ${sa[2]} in namespace ${sa[1]}` : `user ${JSON.stringify(username)}, not a service account`;
      return this.refuse(
        'wrong-identity',
        `the token belongs to ${who}; this server accepts only ${this.expectedUsername} (${AGENT_NAMESPACE}, ${AGENT_SERVICE_ACCOUNT})`,
      );
    }
    const identity = this.identity(status.user ?? {}, token);
    this.remember(key, identity);
    return { ok: true, identity, cached: false };
  }

  private identity(user: { uid?: string; extra?: Record<string, string[]> }, token: string): AgentTokenIdentity {
    const identity: AgentTokenIdentity = {
      username: this.expectedUsername,
      uid: user.uid ?? '',
      namespace: this.options.namespace,
      serviceAccount: this.options.serviceAccount,
    };
    const extra = (k: string): string | undefined => user.extra?.[k]?.[0];
    const podName = extra(EXTRA_POD_NAME);
    const podUid = extra(EXTRA_POD_UID);
    const nodeName = extra(EXTRA_NODE_NAME);
    const credentialId = extra(EXTRA_CREDENTIAL_ID);
    const exp = jwtClaims(token)?.exp;
    if (podName !== undefined) identity.podName = podName;
    if (podUid !== undefined) identity.podUid = podUid;
    if (nodeName !== undefined) identity.nodeName = nodeName;
    if (credentialId !== undefined) identity.credentialId = credentialId;
    if (exp !== undefined) identity.expiresAt = new Date(exp * 1000);
    return identity;
  }

  private remember(key: string, identity: AgentTokenIdentity): void {
    if (this.cacheTtlMs <= 0) return;
    const until = Math.min(this.now() + this.cacheTtlMs, identity.expiresAt?.getTime() ?? Infinity);
    if (until <= this.now()) return;
    this.cache.set(key, { identity, until });
    while (this.cache.size > this.maxCacheEntries) this.cache.delete(this.cache.keys().next().value!);
  }

  private rememberRefusal(key: string, refusal: TokenRefusal): void {
    if (this.refusalCacheTtlMs <= 0) return;
    this.refused.set(key, { refusal, until: this.now() + this.refusalCacheTtlMs });
    while (this.refused.size > this.maxCacheEntries) this.refused.delete(this.refused.keys().next().value!);
  }

  private refuse(kind: TokenRefusalKind, reason: string, agentFault = true): TokenAuthentication {
    this.counts.refusals[kind]++;
    return { ok: false, refusal: { kind, reason, agentFault } };
  }
}

/**
 * The claims of a JWT, unverified: used only for the expiry of a token the
 * API has authenticated, and to explain a refusal.
 */
function jwtClaims(token: string): { exp?: number; aud?: string[] } | undefined {
  const parts = token.split('.');
  if (parts.length !== 3) return undefined;
  try {
    const claims = JSON.parse(Buffer.from(parts[1], 'base64url').toString('utf8')) as { exp?: unknown; aud?: unknown };
    const aud = typeof claims.aud === 'string' ? [claims.aud] : Array.isArray(claims.aud) ? claims.aud.map(String) : undefined;
    return { ...(typeof claims.exp === 'number' ? { exp: claims.exp } : {}), ...(aud ? { aud } : {}) };
  } catch {
    return undefined;
  }
}
