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
  /** Which resolver answered ("cluster DNS 10.96.0.10:53", "system"), for errors and the audit log. */
  readonly resolver: string;
}

export interface ResolveOptions {
  timeoutMs: number;
  signal?: CancelSignal;
}
