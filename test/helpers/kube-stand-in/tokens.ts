/**
 * The token side of the Kubernetes API stand-in: service account tokens as
 * JWTs (HMAC-signed here; the API server signs with its key, which a
 * TokenReview client never sees) and static tokens, authenticated with the
 * kube-apiserver's rules (k8s.io/kubernetes pkg/serviceaccount/jwt.go,
 * claims.go; pkg/registry/authentication/tokenreview/storage.go):
 * - the requested audiences default to the API's own (`--api-audiences`);
 * - a JWT whose audiences miss every requested one is refused with
 *   `token audiences [...] is invalid for the target audiences [...]`;
 * - an authenticated answer carries the intersection as `audiences`;
 * - audience-agnostic (static) tokens authenticate only when the requested
 *   audiences include the API's own (authenticator.WrapAudienceAgnosticToken);
 * - errors reach the client aggregated behind `invalid bearer token`.
 */
import { createHmac, randomBytes, randomUUID, timingSafeEqual } from 'node:crypto';

export const DEFAULT_API_AUDIENCE = 'https://kubernetes.default.svc.cluster.local';

export interface TokenUser {
  username: string;
  uid?: string;
  groups?: string[];
  extra?: Record<string, string[]>;
}

export interface ServiceAccountTokenSpec {
  namespace: string;
  serviceAccount: string;
  /** The projected volume's `audience` (default: the API's own audiences). */
  audiences?: string[];
  /** Lifetime from now; negative issues a token that is already expired (default 3600). */
  expiresInSeconds?: number;
  /** Bound pod (`authentication.kubernetes.io/pod-name`, `pod-uid` in the answer's extra). */
  pod?: { name: string; uid?: string };
  /** Node of the bound pod (`authentication.kubernetes.io/node-name`, `node-uid`). */
  node?: { name: string; uid?: string };
}

export type Authentication =
  { authenticated: true; user: Required<TokenUser>; audiences: string[] } | { authenticated: false; error: string };

interface ServiceAccountClaims {
  iss: string;
  sub: string;
  aud: string[];
  exp: number;
  iat: number;
  nbf: number;
  jti: string;
  'kubernetes.io': {
    namespace: string;
    serviceaccount: { name: string; uid: string };
    pod?: { name: string; uid: string };
    node?: { name: string; uid: string };
  };
}

const INVALID = 'invalid bearer token';

/** Go's %q of a []string: ["a" "b"]. */
const goQuote = (list: readonly string[]): string => `[${list.map((a) => JSON.stringify(a)).join(' ')}]`;
const b64url = (data: Buffer | string): string => Buffer.from(data).toString('base64url');

export class TokenAuthority {
  private readonly key = randomBytes(32);
  private readonly revoked = new Set<string>();
  private readonly staticTokens = new Map<string, { user: TokenUser; audiences?: string[] }>();
  /** A stable uid per service account, as the API server keeps one per object. */
  private readonly serviceAccountUids = new Map<string, string>();

  constructor(
    readonly apiAudiences: readonly string[] = [DEFAULT_API_AUDIENCE],
    readonly issuer = DEFAULT_API_AUDIENCE,
  ) {}

  issueServiceAccountToken(spec: ServiceAccountTokenSpec): string {
    const now = Math.floor(Date.now() / 1000);
    const saKey = `${spec.namespace}/${spec.serviceAccount}`;
    let saUid = this.serviceAccountUids.get(saKey);
    if (!saUid) {
      saUid = randomUUID();
      this.serviceAccountUids.set(saKey, saUid);
    }
    const claims: ServiceAccountClaims = {
      iss: this.issuer,
      sub: `system:serviceaccount:${spec.namespace}:${spec.serviceAccount}`,
      aud: spec.audiences ?? [...this.apiAudiences],
      exp: now + (spec.expiresInSeconds ?? 3600),
      iat: now,
      nbf: now,
      jti: randomUUID(),
      'kubernetes.io': {
        namespace: spec.namespace,
        serviceaccount: { name: spec.serviceAccount, uid: saUid },
        ...(spec.pod ? { pod: { name: spec.pod.name, uid: spec.pod.uid ?? randomUUID() } } : {}),
        ...(spec.node ? { node: { name: spec.node.name, uid: spec.node.uid ?? randomUUID() } } : {}),
      },
    };
    const signingInput = `${b64url(JSON.stringify({ alg: 'HS256', typ: 'JWT' }))}.${b64url(JSON.stringify(claims))}`;
    return `${signingInput}.${b64url(createHmac('sha256', this.key).update(signingInput).digest())}`;
  }

  /**
   * A token the API knows without a JWT (a static token file, or a webhook).
   * Without `audiences` it is audience-agnostic, as those authenticators are.
   */
  registerStaticToken(token: string, user: TokenUser, audiences?: string[]): void {
    this.staticTokens.set(token, { user, ...(audiences ? { audiences } : {}) });
  }

  /** As if the bound pod was deleted: the token stops authenticating. */
  revoke(token: string): void {
    this.revoked.add(token);
  }

  /** `requestedAudiences` empty → the API's own audiences. */
  authenticate(token: string, requestedAudiences: readonly string[] = []): Authentication {
    const requested = requestedAudiences.length > 0 ? [...requestedAudiences] : [...this.apiAudiences];
    const fixed = this.staticTokens.get(token);
    if (fixed) {
      const tokenAudiences = fixed.audiences ?? [...this.apiAudiences];
      const audiences = requested.filter((a) => tokenAudiences.includes(a));
      if (audiences.length === 0) return { authenticated: false, error: INVALID };
      return { authenticated: true, user: withAuthenticatedGroup(fixed.user), audiences };
    }
    const claims = this.verify(token);
    if (claims === undefined) return { authenticated: false, error: INVALID };
    if (typeof claims === 'string') return { authenticated: false, error: `[${INVALID}, ${claims}]` };
    const audiences = requested.filter((a) => claims.aud.includes(a));
    if (audiences.length === 0) {
      return {
        authenticated: false,
        error: `[${INVALID}, token audiences ${goQuote(claims.aud)} is invalid for the target audiences ${goQuote(requested)}]`,
      };
    }
    if (claims.exp <= Date.now() / 1000) return { authenticated: false, error: `[${INVALID}, service account token has expired]` };
    if (this.revoked.has(token)) return { authenticated: false, error: `[${INVALID}, service account token has been invalidated]` };
    const k = claims['kubernetes.io'];
    const extra: Record<string, string[]> = { 'authentication.kubernetes.io/credential-id': [`JTI=${claims.jti}`] };
    if (k.pod) {
      extra['authentication.kubernetes.io/pod-name'] = [k.pod.name];
      extra['authentication.kubernetes.io/pod-uid'] = [k.pod.uid];
    }
    if (k.node) {
      extra['authentication.kubernetes.io/node-name'] = [k.node.name];
      extra['authentication.kubernetes.io/node-uid'] = [k.node.uid];
    }
    return {
      authenticated: true,
      user: withAuthenticatedGroup({
        username: claims.sub,
        uid: k.serviceaccount.uid,
        groups: ['system:serviceaccounts', `system:serviceaccounts:${k.namespace}`],
        extra,
      }),
      audiences,
    };
  }

  /** The claims; a string for one of ours that fails verification; undefined for a token that is not one of ours. */
  private verify(token: string): ServiceAccountClaims | string | undefined {
    const parts = token.split('.');
    if (parts.length !== 3) return undefined;
    let claims: ServiceAccountClaims;
    try {
      claims = JSON.parse(Buffer.from(parts[1], 'base64url').toString('utf8')) as ServiceAccountClaims;
    } catch {
      return undefined;
    }
    if (claims?.iss !== this.issuer) return undefined;
    const expected = createHmac('sha256', this.key).update(`${parts[0]}.${parts[1]}`).digest();
    const given = Buffer.from(parts[2], 'base64url');
    if (given.length !== expected.length || !timingSafeEqual(given, expected)) return 'square/go-jose: error in cryptographic primitive';
    return claims;
  }
}

function withAuthenticatedGroup(user: TokenUser): Required<TokenUser> {
  const groups = user.groups ?? [];
  return {
    username: user.username,
    uid: user.uid ?? '',
    groups: groups.includes('system:authenticated') ? groups : [...groups, 'system:authenticated'],
    extra: user.extra ?? {},
  };
}
