/**
 * Names this side asked the peer to resolve (KANAL_RESOLVE_REQ, with the
 * resolve feature; docs/protocol.md, "Resolve"): each waits, with its timer
 * and its requester's cancel signal, for KANAL_RESOLVE_RSP or for the stream
 * to go. At most MAX_PENDING_RESOLVES per tunnel: a requester that floods
 * names gets 'exhausted' here, before the peer is asked.
 *
 * There is no cancel packet: a request given up here (timeout, cancel) is
 * forgotten, and a late answer for it is dropped. Pending requests fail when
 * the stream is lost, even when the tunnel resumes: a resolve is short and
 * idempotent, so the requester asks again rather than this side replaying it.
 */
import { isIP } from 'node:net';
import { truncateForLog } from '../common/log-safety.js';
import { PacketType, RESOLVE_BOUNDS, type Packet, type ResolveResponsePacket } from '../wire/packet.js';
import type { DialFailure } from '../domain/dial-result.js';
import { randomDialID } from './dial-id.js';
import { DialError } from './errors.js';
import type { ResolvedName, ResolveOptions } from './name-resolution.js';

export const MAX_PENDING_RESOLVES = 64;

/** Longest KANAL_RESOLVE_REQ timeoutMs (a uint32). */
const MAX_WIRE_TIMEOUT_MS = 0xffff_ffff;

interface PendingResolve {
  name: string;
  resolve(answer: ResolvedName): void;
  reject(err: DialError): void;
  cleanup(): void;
}

export interface ResolveRequestsOptions {
  /** Sends a packet to the peer (nothing while the tunnel is not open). */
  send(packet: Packet): void;
  maxPending?: number;
}

/** `name` as an IP literal (brackets of an IPv6 one dropped), or undefined when it is a name. */
export function ipLiteral(name: string): string | undefined {
  const bare = name.startsWith('[') && name.endsWith(']') ? name.slice(1, -1) : name;
  return isIP(bare) === 0 ? undefined : bare;
}

export class ResolveRequests {
  private readonly pending = new Map<bigint, PendingResolve>();
  private readonly maxPending: number;

  constructor(private readonly opts: ResolveRequestsOptions) {
    this.maxPending = opts.maxPending ?? MAX_PENDING_RESOLVES;
  }

  get size(): number {
    return this.pending.size;
  }

  /** Asks the peer for `name`; settles on its answer, the timeout, the requester's cancel, or failAll(). */
  start(name: string, opts: ResolveOptions): Promise<ResolvedName> {
    const shown = truncateForLog(name, 80);
    if (name === '' || Buffer.byteLength(name, 'utf8') > RESOLVE_BOUNDS.nameBytes)
      return Promise.reject(new DialError('unresolved', `cannot resolve ${JSON.stringify(shown)}: not a host name (1-253 bytes)`));
    if (this.pending.size >= this.maxPending)
      return Promise.reject(
        new DialError('exhausted', `cannot resolve ${shown}: ${this.maxPending} names are being resolved through this tunnel already`),
      );
    if (opts.signal?.aborted) return Promise.reject(new DialError('cancelled', `resolving ${shown} cancelled`));
    let requestID = randomDialID();
    while (this.pending.has(requestID)) requestID = randomDialID();
    return new Promise<ResolvedName>((resolve, reject) => {
      const giveUp = (failure: DialFailure, message: string): void => {
        if (!this.settle(requestID)) return;
        reject(new DialError(failure, message));
      };
      const timer = setTimeout(
        () => giveUp('unresolved', `cannot resolve ${shown}: the agent did not answer within ${opts.timeoutMs} ms`),
        opts.timeoutMs,
      );
      const onAbort = (): void => giveUp('cancelled', `resolving ${shown} cancelled by the requester`);
      opts.signal?.addEventListener('abort', onAbort);
      this.pending.set(requestID, {
        name: shown,
        resolve,
        reject,
        cleanup: () => {
          clearTimeout(timer);
          opts.signal?.removeEventListener('abort', onAbort);
        },
      });
      const timeoutMs = Math.min(MAX_WIRE_TIMEOUT_MS, Math.max(1, Math.ceil(opts.timeoutMs)));
      this.opts.send({ type: PacketType.KANAL_RESOLVE_REQ, requestID, name, timeoutMs });
    });
  }

  /** KANAL_RESOLVE_RSP: the peer's answer (its text bounded: it is the peer's). A late or unknown one is dropped. */
  answered(p: ResolveResponsePacket): void {
    const pending = this.pending.get(p.requestID);
    if (!pending || !this.settle(p.requestID)) return;
    const resolver = truncateForLog(p.resolver || 'the agent', 80);
    if (p.error !== '' || p.addresses.length === 0) {
      const why = p.error === '' ? 'no addresses' : truncateForLog(p.error, 200);
      pending.reject(new DialError('unresolved', `cannot resolve ${pending.name}: ${why} (resolver: ${resolver})`));
      return;
    }
    pending.resolve({ addresses: p.addresses, resolver, ...(p.ttl === undefined ? {} : { ttlSeconds: p.ttl }) });
  }

  /** The stream went (closed, or lost until a resume): every request fails with `failure`. */
  failAll(failure: DialFailure, why: string): void {
    for (const [id, pending] of this.pending) {
      this.settle(id);
      pending.reject(new DialError(failure, `cannot resolve ${pending.name}: ${why}`));
    }
  }

  /** Forgets request `id`; false when it was not pending. */
  private settle(id: bigint): boolean {
    const pending = this.pending.get(id);
    if (!pending) return false;
    this.pending.delete(id);
    pending.cleanup();
    return true;
  }
}
