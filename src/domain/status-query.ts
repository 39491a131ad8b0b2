/**
 * What a caller asks a server's /status for (docs/operations.md, "What is
 * connected: `kanal status`"): `?tenant=NAME`, `?agent=ID` (exact), `?limit=N`
 * agents, and `?after=CURSOR` (a page's `next`). A page is also bounded in
 * bytes, so an agent announcing the longest identifiers it may cannot make an
 * answer large (docs/limits.md).
 */

export interface StatusQuery {
  tenant?: string;
  agent?: string;
  limit: number;
  /** The previous page's `next`: opaque to the caller. */
  after?: string;
}

export const DEFAULT_STATUS_LIMIT = 100;
export const MAX_STATUS_LIMIT = 1000;
/** A page stops adding agents once its body is this long (it always carries at least one). */
export const MAX_STATUS_PAGE_BYTES = 1024 * 1024;
/** Longest value of tenant=, agent= or after= read: longer than any tenant name, agentID or cursor. */
const MAX_PARAM_CHARS = 1024;

/** The query of a request, or what is wrong with it (answered 400). */
export function parseStatusQuery(q: URLSearchParams): StatusQuery | { error: string } {
  const out: StatusQuery = { limit: DEFAULT_STATUS_LIMIT };
  for (const name of ['tenant', 'agent', 'after'] as const) {
    const v = q.get(name);
    if (v === null || v === '') continue;
    if (v.length > MAX_PARAM_CHARS) return { error: `${name}= is over ${MAX_PARAM_CHARS} characters` };
    out[name] = v;
  }
  const limit = q.get('limit');
  if (limit !== null) {
    if (!/^\d{1,7}$/.test(limit) || Number(limit) < 1 || Number(limit) > MAX_STATUS_LIMIT)
      return { error: `limit= must be a whole number from 1 to ${MAX_STATUS_LIMIT}, got ${JSON.stringify(limit.slice(0, 20))}` };
    out.limit = Number(limit);
  }
  return out;
}

/** The query string (without '?') asking for `q`. */
export function statusQueryString(q: Partial<StatusQuery>): string {
  const p = new URLSearchParams();
  if (q.tenant !== undefined) p.set('tenant', q.tenant);
  if (q.agent !== undefined) p.set('agent', q.agent);
  if (q.limit !== undefined) p.set('limit', String(q.limit));
  if (q.after !== undefined) p.set('after', q.after);
  return p.toString();
}
