/**
 * 6. Start: fresh pairs of each product, started one after another
 * (alternating which goes first): the time from exec to ready (the server's
 * /healthz; the agent's /readyz, i.e. its tunnel up), the CPU each spent
 * getting there and its RSS then. What a restart, a node boot or a rolling
 * update costs before the first dial; the first dials after it are in 2a.
 */
import { cpuSeconds, rssAnonBytes, rssBytes } from './proc.js';
import { median, spread } from './stats.js';
import { pairOf, products, withFreshPair, type Env } from './env.js';
import type { Product } from './loadgen-protocol.js';
import type { Row } from './report.js';

const MiB = 1024 * 1024;

interface StartRun {
  serverReadyMs: number;
  agentReadyMs: number;
  serverCpuMs: number;
  agentCpuMs: number;
  serverRssMiB: number;
  agentRssMiB: number;
  serverAnonMiB: number;
  agentAnonMiB: number;
}

const FIGURES = [
  'serverReadyMs',
  'agentReadyMs',
  'serverCpuMs',
  'agentCpuMs',
  'serverRssMiB',
  'agentRssMiB',
  'serverAnonMiB',
  'agentAnonMiB',
] as const;
const LABEL: Record<Product, string> = { kanal: 'Kanal', upstream: 'upstream' };

export async function runStart(env: Env): Promise<Row[]> {
  const runs = new Map<Product, StartRun[]>(products(env).map((p) => [p, []]));
  for (let rep = 0; rep < env.params.startRuns; rep++) {
    const order = rep % 2 === 0 ? products(env) : [...products(env)].reverse();
    for (const product of order) {
      env.progress(`start (${product}): fresh pair ${rep + 1} of ${env.params.startRuns}`);
      await withFreshPair(env, product, `start-${product}-${rep}`, (fresh) => {
        const pair = pairOf(fresh, product);
        // Read at once: the pair is idle, and later reads would include the loadgen's first connection.
        runs.get(product)!.push({
          serverReadyMs: pair.readyMs.server,
          agentReadyMs: pair.readyMs.agent,
          serverCpuMs: cpuSeconds(pair.server.pid) * 1000,
          agentCpuMs: cpuSeconds(pair.agent.pid) * 1000,
          serverRssMiB: rssBytes(pair.server.pid) / MiB,
          agentRssMiB: rssBytes(pair.agent.pid) / MiB,
          serverAnonMiB: rssAnonBytes(pair.server.pid) / MiB,
          agentAnonMiB: rssAnonBytes(pair.agent.pid) / MiB,
        });
        return Promise.resolve();
      });
    }
  }
  const upstream = runs.get('upstream');
  return [...runs].map(([product, r]): Row => {
    const values: Record<string, number> = { runs: r.length };
    for (const f of FIGURES) {
      const series = r.map((run) => run[f]);
      values[f] = median(series);
      values[`${f}Spread`] = spread(series);
      if (product === 'kanal' && upstream && upstream.length > 0) values[`${f}VsUpstream`] = values[f] / median(upstream.map((u) => u[f]));
    }
    return {
      id: product === 'kanal' ? 'start.pair' : 'start.pair.upstream',
      section: 'start',
      label: `${LABEL[product]}: exec -> ready`,
      values,
    };
  });
}
