/**
 * Who a frontend client is (docs/frontends.md, "Clients"): the `clients:`
 * entry its credentials match. A bearer token decides when one was
 * presented: a static token (token-file, compared by SHA-256 in constant
 * time) or a service account's (TokenReview); else the connection's own
 * identity: its certificate's subject (exact) or its Unix peer's uid. No
 * match is a ClientRefused: 407 when a token could still admit it, else 403.
 */
import { timingSafeEqual } from 'node:crypto';
import { truncateForLog } from '../../common/log-safety.js';
import type { ClientIdentity } from '../../tunnel/connection.js';
import type { ClientEntry } from './client-entry.js';
import { ClientRefused, type ClientCredentials } from './frontend-client.js';
import { tokenDigestOf } from './token-digest.js';

/** What a bearer token's review says (client-token-review.ts). */
export type ReviewOutcome = { ok: true; username: string } | { ok: false; reason: string };

/** Reviews a bearer token with the Kubernetes API (TokenReview). */
export interface TokenReviewer {
  review(token: string, peer: string): Promise<ReviewOutcome>;
}

/** `uid 1000 on unix:/run/kanal.sock`, `certificate subject "CN=x" from 10.0.0.1:5000`, or the address. */
export function describeIdentity(identity: ClientIdentity): string {
  const parts: string[] = [];
  if (identity.subject !== undefined) parts.push(`certificate subject ${JSON.stringify(truncateForLog(identity.subject, 200))}`);
  if (identity.uid !== undefined) parts.push(`uid ${identity.uid}`);
  const what = parts.length > 0 ? parts.join(', ') : 'a client without certificate or Unix peer credentials';
  return `${what} (${truncateForLog(identity.address, 120)})`;
}

export class ClientAdmission {
  private readonly bySubject = new Map<string, ClientEntry>();
  private readonly byUid = new Map<number, ClientEntry>();
  private readonly byServiceAccount = new Map<string, ClientEntry>();
  private readonly tokens: ClientEntry[] = [];

  constructor(
    entries: readonly ClientEntry[],
    private readonly reviewer?: TokenReviewer,
  ) {
    for (const e of entries) {
      if (e.subject !== undefined) this.bySubject.set(e.subject, e);
      if (e.uid !== undefined) this.byUid.set(e.uid, e);
      if (e.serviceAccount) this.byServiceAccount.set(`system:serviceaccount:${e.serviceAccount.namespace}:${e.serviceAccount.name}`, e);
      if (e.token) this.tokens.push(e);
    }
    if (this.byServiceAccount.size > 0 && !reviewer) throw new Error('service-account clients need a token reviewer');
  }

  /** Whether a bearer token could admit a client (a 407 then asks for one). */
  get takesTokens(): boolean {
    return this.tokens.length > 0 || this.byServiceAccount.size > 0;
  }

  /** The entry `credentials` match; rejects with ClientRefused naming what to present or why not. */
  async admit({ identity, token }: ClientCredentials): Promise<ClientEntry> {
    if (token !== undefined && token !== '') return this.byToken(token, identity);
    const entry =
      (identity.subject !== undefined ? this.bySubject.get(identity.subject) : undefined) ??
      (identity.uid !== undefined ? this.byUid.get(identity.uid) : undefined);
    if (entry) return entry;
    const who = describeIdentity(identity);
    if (this.takesTokens)
      throw new ClientRefused(407, `no client entry matches ${who}: present a bearer token (Proxy-Authorization: Bearer <token>)`);
    throw new ClientRefused(403, `no client entry matches ${who}: add an entry with its subject or uid to clients:`);
  }

  private async byToken(token: string, identity: ClientIdentity): Promise<ClientEntry> {
    const digest = tokenDigestOf(token);
    // Every static token is compared, so the time taken says nothing of which (or whether one) matched.
    let found: ClientEntry | undefined;
    for (const e of this.tokens) if (e.token && timingSafeEqual(e.token.digest, digest) && !found) found = e;
    if (found) return found;
    if (this.byServiceAccount.size === 0 || !this.reviewer)
      throw new ClientRefused(403, `the bearer token of ${describeIdentity(identity)} is no client entry's token`);
    const outcome = await this.reviewer.review(token, identity.address);
    if (!outcome.ok) throw new ClientRefused(403, `the bearer token of ${describeIdentity(identity)} was not accepted: ${outcome.reason}`);
    const entry = this.byServiceAccount.get(outcome.username);
    if (entry) return entry;
    throw new ClientRefused(
      403,
      `the bearer token of ${describeIdentity(identity)} belongs to ${truncateForLog(outcome.username, 200)}, which no client entry names (service-account)`,
    );
  }
}
