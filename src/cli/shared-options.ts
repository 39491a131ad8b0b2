/** yargs options the commands share (their values are checked by src/common/flag-values.ts). */
import { DEFAULT_LIMITS } from '../tunnel/limits.js';

/** `--max-connection-window`, the same on server and agent: each bounds what it receives. */
export const maxConnectionWindowOption = {
  type: 'number',
  default: DEFAULT_LIMITS.maxWindowBytes,
  describe:
    'Receive window a tunnelled connection may grow to while it moves bulk data, bytes; 1048576 (the window every connection starts with) turns growth off. Lower favours latency next to bulk transfers, higher favours their throughput',
} as const;

/** `--peer-read-timeout`, the same on server and agent (TunnelLimits.peerReadTimeoutMs). */
export const peerReadTimeoutOption = {
  type: 'string',
  default: `${DEFAULT_LIMITS.peerReadTimeoutMs / 1000}s`,
  describe: 'A peer that leaves what this side sent unread (it stopped reading, or floods requests without reading the answers) is not read from either; its stream is closed after this long',
} as const;
