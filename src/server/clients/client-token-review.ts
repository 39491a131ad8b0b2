/**
 * Service-account clients' bearer tokens checked with a TokenReview
 * (authentication.k8s.io/v1) against the tenant's kube-apiserver, with the
 * tenant's audience (--authentication-audience, as for agents: see
 * identity/token-authenticator.ts). The username the API vouches for names
 * the client (client-admission.ts matches it to an entry). Accepted tokens
 * are remembered for `cacheTtlMs` (default 10 s) by SHA-256, bounded;
 * concurrent reviews of one token share one call.
 */
// Types only: the Kubernetes client library loads where a client is made (kube/kube-clients.ts), not with the server.
import type { KubeApi } from '../../kube/kube-api.js';
import { errorMessage } from '../../common/error-message.js';
import type { ReviewOutcome, TokenReviewer } from './client-admission.js';
import { tokenDigestOf } from './token-digest.js';

export interface ClientTokenReviewOptions {
  api: KubeApi;
  audience: string;
  reviewTimeoutMs?: number;
  cacheTtlMs?: number;
  maxCacheEntries?: number;
  /** Longer tokens are refused unreviewed (Kubernetes tokens are ~1 KiB). */
  maxTokenBytes?: number;
  now?: () => number;
}

export class ClientTokenReview implements TokenReviewer {
  private readonly cache = new Map<string, { username: string; until: number }>();
  private readonly inFlight = new Map<string, Promise<ReviewOutcome>>();
  private readonly now: () => number;

  constructor(private readonly opts: ClientTokenReviewOptions) {
    this.now = opts.now ?? Date.now;
  }

  review(token: string): Promise<ReviewOutcome> {
    if (Buffer.byteLength(token) > (this.opts.maxTokenBytes ?? 16 * 1024))
      return Promise.resolve({ ok: false, reason: 'the token is too long' });
    const key = tokenDigestOf(token).toString('hex');
    const hit = this.cache.get(key);
    if (hit && hit.until > this.now()) return Promise.resolve({ ok: true, username: hit.username });
    if (hit) this.cache.delete(key);
    const joined = this.inFlight.get(key);
    if (joined) return joined;
    const pending = this.call(token, key).finally(() => this.inFlight.delete(key));
    this.inFlight.set(key, pending);
    return pending;
  }

  private async call(token: string, key: string): Promise<ReviewOutcome> {
    const { api, audience } = this.opts;
    let status;
    try {
      const review = await api.call(
        `TokenReview of a frontend client for audience ${audience}`,
        (options) =>
          api.authentication.createTokenReview(
            { body: { apiVersion: 'authentication.k8s.io/v1', kind: 'TokenReview', spec: { token, audiences: [audience] } } },
            options,
          ),
        { timeoutMs: this.opts.reviewTimeoutMs ?? 5000 },
      );
      status = review.status;
    } catch (err) {
      return { ok: false, reason: `cannot check the token now: ${errorMessage(err)}` };
    }
    if (!status?.authenticated)
      return { ok: false, reason: `the Kubernetes API did not authenticate it${status?.error ? `: ${status.error}` : ''}` };
    if (!(status.audiences ?? []).includes(audience))
      return { ok: false, reason: `it is not for the audience ${JSON.stringify(audience)} the server's token review asks for` };
    const username = status.user?.username ?? '';
    const ttl = this.opts.cacheTtlMs ?? 10_000;
    if (ttl > 0) {
      this.cache.set(key, { username, until: this.now() + ttl });
      const max = this.opts.maxCacheEntries ?? 1000;
      while (this.cache.size > max) this.cache.delete(this.cache.keys().next().value!);
    }
    return { ok: true, username };
  }
}
