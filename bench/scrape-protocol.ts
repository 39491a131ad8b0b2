/** Commands of the scrape worker (bench/scrape-worker.ts): many tiny /metrics targets, and a Prometheus-like scraper. */

/**
 * How a scrape reaches its target:
 * - forward  absolute-form `GET http://host:port/metrics` to the proxy, on a keep-alive pool of
 *            connections to the proxy shared by every target (as Go's net/http Transport with an
 *            HTTP proxy pools connections for all http:// targets behind that proxy)
 * - connect  one CONNECT per target, that tunnel kept alive and every scrape of the target sent on it
 */
export type ScrapeVia = 'forward' | 'connect';

/** The proxy to scrape through: its Unix socket, or a plain TCP listener. */
export type ProxyAddress = { uds: string } | { host: string; port: number };

export interface ScrapeSpec {
  id: string;
  via: ScrapeVia;
  proxy: ProxyAddress;
  /** Targets, host:port each; every one is scraped once per interval. */
  targets: string[];
  intervalMs: number;
  /** A scrape still running after this long is abandoned and counted as a timeout (Prometheus: scrape_timeout). */
  timeoutMs: number;
}

export interface ScrapeResult {
  /** Latency of every scrape completed since the warm-up round: request written -> last body byte. */
  latenciesMs: number[];
  /** Scrapes that answered something other than 200, by status ("405": 12). */
  statuses: Record<string, number>;
  /** Ticks skipped because the target's previous scrape was still running. */
  skipped: number;
  errors: number;
  firstError?: string;
  /** Connections the scraper opened to the proxy over the whole run (warm-up included). */
  connections: number;
  elapsedMs: number;
}

export type ScrapeCommands = {
  /** Target role: `count` HTTP servers on `host`, each answering GET /metrics with a page of `bodyBytes`. */
  serveTargets: { args: { host: string; count: number; bodyBytes: number }; result: { ports: number[] } };
  /** Sockets the target role has open. */
  openSockets: { args: null; result: { open: number } };
  /** One request through the proxy, outside any timing: the status it answers (0: no answer) and the start of its body. */
  probe: { args: { via: ScrapeVia; proxy: ProxyAddress; target: string }; result: { status: number; body: string } };
  /**
   * Scraper role: starts scraping, every target at its own offset within the interval, and resolves
   * once every target has been scraped once (connections set up: the warm-up round, not counted).
   */
  startScrape: { args: ScrapeSpec; result: { warmupErrors: number; firstError?: string } };
  /** Stops scheduling, waits for the scrapes in flight, closes every connection; figures since the warm-up round. */
  stopScrape: { args: { id: string }; result: ScrapeResult };
};
