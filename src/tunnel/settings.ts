/** The tunnel's settings, the same on server and agent: each side bounds what it receives (docs/limits.md). */
import { connectionWindowFlag, durationFlag } from '../settings/checks.js';
import { setting } from '../settings/kinds.js';
import { DEFAULT_LIMITS } from './limits.js';

export const LIMITS = 'Limits';

export const tunnelSettings = {
  'max-connection-window': setting({
    type: 'number',
    default: DEFAULT_LIMITS.maxWindowBytes,
    describe:
      'Receive window a tunnelled connection may grow to while it moves bulk data, bytes; 1048576 (the window every connection starts with) turns growth off. Lower favours latency next to bulk transfers, higher favours their throughput',
    group: LIMITS,
    parse: (v: number, flag) => connectionWindowFlag(flag, v, DEFAULT_LIMITS.windowBytes),
  }),
  'peer-read-timeout': setting({
    type: 'string',
    default: `${DEFAULT_LIMITS.peerReadTimeoutMs / 1000}s`,
    describe:
      'A peer that leaves what this side sent unread (it stopped reading, or floods requests without reading the answers) is not read from either; its stream is closed after this long',
    group: LIMITS,
    parse: (v: string, flag) => durationFlag(flag, v),
  }),
} as const;
