/**
 * A name resolved by the far side of a tunnel, inside the cluster (the agent's
 * resolver; the cluster's DNS Service for Service names): what the server
 * needs to apply a client's rules to the addresses a name stands for before
 * anything is dialled (docs/frontends.md).
 */
import type { CancelSignal } from '../common/cancel.js';

export interface ResolvedName {
  /** IPv4 and IPv6 addresses, in the resolver's order; never empty. */
  readonly addresses: readonly string[];
  /** Which resolver answered ("cluster DNS 10.96.0.10:53", "system resolver", "IP literal"), for errors and the audit log. */
  readonly resolver: string;
  /** How long the answer holds (seconds), when the resolver said. */
  readonly ttlSeconds?: number;
}

export interface ResolveOptions {
  timeoutMs: number;
  signal?: CancelSignal;
}

/** What the side that resolves (the agent) answers for a name: IP literals, in order. */
export interface ResolveAnswer {
  readonly addresses: readonly string[];
  /** Which resolver answered, as in ResolvedName. */
  readonly resolver: string;
  /** How long the answer holds, when the resolver said (DNS TTL). */
  readonly ttlSeconds?: number;
}

/**
 * Resolves a name the peer asked for (TunnelOptions.resolveHandler). Throws
 * NameNotResolved (or any Error) when it cannot; `signal` aborts when the
 * asker gave up or the tunnel closed.
 */
export type ResolveHandler = (name: string, signal: CancelSignal) => Promise<ResolveAnswer>;

/** A name that did not resolve, with the resolver that said so (told to the asker). */
export class NameNotResolved extends Error {
  override name = 'NameNotResolved';
  constructor(
    message: string,
    readonly resolver: string,
  ) {
    super(message);
  }
}
