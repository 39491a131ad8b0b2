/**
 * How many servers an agent should hold tunnels to (`--server-count-source`),
 * with upstream v0.36's rule (pkg/agent/server_counter.go):
 * without lease counting, the serverCount the last newly connected server
 * announced; with it, the lease count ('default') or the larger of the two
 * ('max'); never less than 1.
 */
import { UsageError } from '../common/usage-error.js';

export type ServerCountSource = 'default' | 'max';

export const SERVER_COUNT_SOURCES: readonly ServerCountSource[] = ['default', 'max'];

export function parseServerCountSource(value: string): ServerCountSource {
  const source = SERVER_COUNT_SOURCES.find((s) => s === value);
  if (!source) throw new UsageError(`--server-count-source ${JSON.stringify(value)}: use ${SERVER_COUNT_SOURCES.join(' or ')}`);
  return source;
}

export interface ServerCount {
  count: number;
  /** Where the count came from, for the log line when it changes (upstream's labels). */
  from: 'KNP lease count' | 'KNP server response headers' | 'fallback to 1';
}

/**
 * @param fromLeases the lease counter's count, or undefined without `--count-server-leases`
 * @param fromResponses the serverCount header of the last server newly connected to (0: none yet)
 */
export function serverCount(source: ServerCountSource, fromLeases: number | undefined, fromResponses: number): ServerCount {
  let result: ServerCount;
  if (fromLeases === undefined) result = { count: fromResponses, from: 'KNP server response headers' };
  else if (source === 'max' && fromResponses > fromLeases) result = { count: fromResponses, from: 'KNP server response headers' };
  else result = { count: fromLeases, from: 'KNP lease count' };
  return result.count > 0 ? result : { count: 1, from: 'fallback to 1' };
}
