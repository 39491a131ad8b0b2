/**
 * The health and admin ports' limits, the same on server and agent: anyone
 * who reaches these ports may open connections and leave answers unread
 * (docs/limits.md, "Health and admin ports").
 */
import { count, duration } from './kinds.js';
import { DEFAULT_HTTP_PORT_LIMITS, type HttpPortLimits } from '../common/http-listener.js';

const PORTS = 'Health and admin ports';

export const httpPortSettings = {
  'http-max-connections': count({
    default: DEFAULT_HTTP_PORT_LIMITS.maxConnections,
    min: 4,
    describe:
      'Connections the health port, and the admin port, each hold at once (one peer address at most a quarter of them); more are closed at once',
    group: PORTS,
  }),
  'http-idle-timeout': duration({
    default: `${DEFAULT_HTTP_PORT_LIMITS.idleTimeoutMs / 1000}s`,
    describe:
      'A health or admin connection that moves no byte for this long (a request not sent, an answer not read) is closed; also the time allowed for a request head',
    group: PORTS,
  }),
} as const;

export function httpPortLimits(v: { 'http-max-connections': number; 'http-idle-timeout': number }): HttpPortLimits {
  return { maxConnections: v['http-max-connections'], idleTimeoutMs: v['http-idle-timeout'] };
}
