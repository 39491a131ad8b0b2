/**
 * What a dial is to the code around a tunnel: a dial the peer asks this side
 * to perform (and who performs it), and the options of a dial this side asks
 * the peer for (DIAL_REQ / DIAL_RSP / DIAL_CLS, docs/protocol.md).
 */
import type { Duplex } from 'node:stream';
import type { CancelSignal } from '../common/cancel.js';
import type { TunnelConnection } from './connection.js';

/** A dial the peer asked us to perform. */
export interface InboundDial {
  protocol: string;
  address: string;
  dialID: bigint;
  /** Aborted when the peer cancels (DIAL_CLS) or the tunnel closes. */
  signal: CancelSignal;
}

/** Performs a dial for the peer and returns the connected socket (or, relaying, a connection of another tunnel), or throws DialError/Error. */
export type DialHandler = (dial: InboundDial) => Promise<Duplex | TunnelConnection>;

export interface DialOptions {
  timeoutMs: number;
  signal?: CancelSignal;
  protocol?: string;
}
