/**
 * --proxy-strategies (upstream pkg/server/proxystrategies): an ordered,
 * comma-separated list; a dial goes to the first strategy that has an agent
 * for it (see router.ts).
 */
export const PROXY_STRATEGIES = ['destHost', 'defaultRoute', 'default'] as const;
export type ProxyStrategy = (typeof PROXY_STRATEGIES)[number];

/** Upstream's default. */
export const DEFAULT_PROXY_STRATEGIES: readonly ProxyStrategy[] = ['default'];

function isProxyStrategy(s: string): s is ProxyStrategy {
  return (PROXY_STRATEGIES as readonly string[]).includes(s);
}

/** As upstream: empty items are skipped, an unknown one or an empty list is an error; a repeated one is too. */
export function parseProxyStrategies(text: string): ProxyStrategy[] {
  const out: ProxyStrategy[] = [];
  for (const item of text.split(',')) {
    const s = item.trim();
    if (s === '') continue;
    if (!isProxyStrategy(s))
      throw new Error(`unknown proxy strategy ${JSON.stringify(s.slice(0, 80))} (known: ${PROXY_STRATEGIES.join(', ')})`);
    if (out.includes(s)) throw new Error(`proxy strategy ${s} is listed twice`);
    out.push(s);
  }
  if (out.length === 0) throw new Error(`proxy strategies cannot be empty (known: ${PROXY_STRATEGIES.join(', ')})`);
  return out;
}
