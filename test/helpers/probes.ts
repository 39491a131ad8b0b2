/**
 * Bounded polls of a running process from outside: HTTP status, Prometheus
 * samples, open file descriptors, any condition.
 */
import fs from 'node:fs';
import http from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';

export function httpGet(url: string, timeoutMs = 2000): Promise<{ status: number; body: string }> {
  return new Promise((resolve) => {
    const req = http.get(url, { timeout: timeoutMs }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      res.on('error', () => resolve({ status: 0, body }));
    });
    req.on('error', () => resolve({ status: 0, body: '' }));
    req.on('timeout', () => req.destroy());
  });
}

/** Polls `url` until it answers `status`; throws after timeoutMs with the last answer. */
export async function waitStatus(url: string, status: number, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last = { status: 0, body: '' };
  while (Date.now() < deadline) {
    last = await httpGet(url);
    if (last.status === status) return;
    await sleep(100);
  }
  throw new Error(`${url}: wanted ${status}, last answer ${last.status} ${last.body.trim()} after ${timeoutMs} ms`);
}

/**
 * Scrapes /metrics and returns every sample as `name{labels}` -> value
 * (labels exactly as exposed, so unlabelled gauges are just `name`).
 */
export async function scrapeMetrics(healthPort: number): Promise<Map<string, number>> {
  const res = await httpGet(`http://127.0.0.1:${healthPort}/metrics`, 5000);
  if (res.status !== 200) throw new Error(`/metrics answered ${res.status}`);
  const out = new Map<string, number>();
  for (const line of res.body.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const cut = line.lastIndexOf(' ');
    out.set(line.slice(0, cut), Number(line.slice(cut + 1)));
  }
  return out;
}

/** Polls /metrics until every named sample has the wanted value; returns the last scrape. */
export async function waitMetrics(healthPort: number, want: Record<string, number>, timeoutMs: number): Promise<Map<string, number>> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const m = await scrapeMetrics(healthPort);
    const wrong = Object.entries(want).filter(([k, v]) => m.get(k) !== v);
    if (wrong.length === 0) return m;
    if (Date.now() >= deadline) {
      throw new Error(`metrics not as wanted after ${timeoutMs} ms: ${wrong.map(([k, v]) => `${k}=${m.get(k)} (want ${v})`).join(', ')}`);
    }
    await sleep(100);
  }
}

/** Polls `cond` (which may be async) every 50 ms until it holds; throws after timeoutMs naming `what`. */
export async function waitUntil(cond: () => boolean | Promise<boolean>, what: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting until ${what}`);
    await sleep(50);
  }
}

/** Open file descriptors of a process (sockets included), from /proc. */
export function fdCount(pid: number): number {
  return fs.readdirSync(`/proc/${pid}/fd`).length;
}
