/**
 * Names the peer asked this side to resolve (KANAL_RESOLVE_REQ, with the
 * resolve feature; docs/protocol.md, "Resolve"): each goes to the
 * ResolveHandler with a cancel signal and is answered with
 * KANAL_RESOLVE_RSP. At most MAX_CONCURRENT_RESOLVES at once; beyond, the
 * request is answered with an error at once, so a peer cannot queue work
 * here. An answer is kept within the packet's bounds (RESOLVE_BOUNDS), since
 * the peer's decoder refuses more. Once the asker's timeout has passed, or
 * the stream is gone, the handler is cancelled and nothing is answered.
 */
import { isIP } from 'node:net';
import { Cancel } from '../common/cancel.js';
import type { RateLimitedLog } from '../common/rate-limited-log.js';
import { PacketType, RESOLVE_BOUNDS, type Packet, type ResolveRequestPacket } from '../wire/packet.js';
import type { ResolveAnswer, ResolveHandler } from './name-resolution.js';

export const MAX_CONCURRENT_RESOLVES = 64;
/** How long a request waits for the handler when the asker did not say. */
const DEFAULT_TIMEOUT_MS = 10_000;
/** Longest wait for the handler whatever the asker says. */
const MAX_TIMEOUT_MS = 60_000;

export interface ResolveAnswersOptions {
  /** Sends a packet to the peer (nothing while the tunnel is not open). */
  send(packet: Packet): void;
  /** Resolves names; absent: every request is answered with an error. */
  handler: ResolveHandler | undefined;
  /** Logs refusals, a line per interval at most. */
  noise: RateLimitedLog;
  maxConcurrent?: number;
}

export class ResolveAnswers {
  /** Requests whose handler runs, by requestID (a repeated ID replaces nothing: it is refused). */
  private readonly running = new Map<bigint, Cancel>();
  private readonly maxConcurrent: number;

  constructor(private readonly opts: ResolveAnswersOptions) {
    this.maxConcurrent = opts.maxConcurrent ?? MAX_CONCURRENT_RESOLVES;
  }

  get size(): number {
    return this.running.size;
  }

  /** KANAL_RESOLVE_REQ from the peer. */
  requested(p: ResolveRequestPacket): void {
    const { requestID, name } = p;
    const handler = this.opts.handler;
    if (!handler) return this.fail(requestID, 'this side does not resolve names', '');
    if (this.running.has(requestID)) return this.fail(requestID, 'a request with this ID is being answered already', '');
    if (this.running.size >= this.maxConcurrent) {
      this.opts.noise.warn('resolve-refused', { limit: this.maxConcurrent }, 'refusing a resolve request: too many being resolved');
      return this.fail(requestID, `${this.maxConcurrent} names are being resolved already; try again`, '');
    }
    const cancel = new Cancel();
    this.running.set(requestID, cancel);
    const timeoutMs = Math.min(MAX_TIMEOUT_MS, p.timeoutMs ?? DEFAULT_TIMEOUT_MS);
    const timer = setTimeout(() => cancel.abort(), timeoutMs);
    const done = (): boolean => {
      clearTimeout(timer);
      const live = this.running.get(requestID) === cancel && !cancel.aborted;
      if (this.running.get(requestID) === cancel) this.running.delete(requestID);
      return live;
    };
    let answer: Promise<ResolveAnswer>;
    try {
      answer = handler(name, cancel);
    } catch (err) {
      answer = Promise.reject(err instanceof Error ? err : new Error(String(err)));
    }
    answer.then(
      (a) => {
        if (done()) this.answer(requestID, a);
      },
      (err: unknown) => {
        if (!done()) return;
        const resolver = err instanceof Error && 'resolver' in err && typeof err.resolver === 'string' ? err.resolver : '';
        this.fail(requestID, err instanceof Error ? err.message : String(err), resolver);
      },
    );
  }

  /** The stream went: every handler is cancelled, and nothing is answered. */
  abortAll(): void {
    const all = [...this.running.values()];
    this.running.clear();
    for (const cancel of all) cancel.abort();
  }

  private answer(requestID: bigint, a: ResolveAnswer): void {
    const addresses = a.addresses.filter((x) => x.length <= 64 && isIP(x) !== 0).slice(0, RESOLVE_BOUNDS.addresses);
    if (addresses.length === 0) return this.fail(requestID, 'no addresses', a.resolver);
    const ttl = a.ttlSeconds === undefined ? 0 : Math.min(0xffff_ffff, Math.max(0, Math.floor(a.ttlSeconds)));
    this.opts.send({
      type: PacketType.KANAL_RESOLVE_RSP,
      requestID,
      addresses,
      error: '',
      resolver: utf8Prefix(a.resolver, RESOLVE_BOUNDS.textBytes),
      ...(ttl > 0 ? { ttl } : {}),
    });
  }

  private fail(requestID: bigint, error: string, resolver: string): void {
    this.opts.send({
      type: PacketType.KANAL_RESOLVE_RSP,
      requestID,
      addresses: [],
      error: utf8Prefix(error || 'not resolved', RESOLVE_BOUNDS.textBytes),
      resolver: utf8Prefix(resolver, RESOLVE_BOUNDS.textBytes),
    });
  }
}

/** The longest prefix of `text` of at most `maxBytes` UTF-8 bytes, cut between characters. */
export function utf8Prefix(text: string, maxBytes: number): string {
  if (Buffer.byteLength(text, 'utf8') <= maxBytes) return text;
  let out = '';
  let bytes = 0;
  for (const ch of text) {
    const n = Buffer.byteLength(ch, 'utf8');
    if (bytes + n > maxBytes - 3) break;
    out += ch;
    bytes += n;
  }
  return `${out}…`;
}
