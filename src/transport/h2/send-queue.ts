/**
 * The send side of one H2PacketStream: what is written to the HTTP/2 stream,
 * and in which order.
 *
 * - Small messages (control packets, small DATA) sent in one turn of the
 *   event loop are gathered into one buffer (`flush()` writes it): a queued
 *   write costs ≈ 200 bytes of objects, so a flood of 30-byte replies to a
 *   peer that does not read took 8 times their size in memory.
 * - Bulk DATA goes to the stream only while fewer than the write-ahead wait
 *   there; the rest is held here. Once in the stream a packet cannot be
 *   passed, so a DIAL_RSP, CLOSE or a new connection's first bytes would wait
 *   behind everything a bulk flow had queued (a dial next to a download).
 *   Held DATA is written as the stream takes what it has (`pump()`).
 * - The write-ahead adapts: small while small messages are being sent (they
 *   wait behind at most that), large while only bulk DATA is (fewer, larger
 *   refills: less CPU per byte).
 *
 * Order (the protocol's only constraint: packets of one connection arrive in
 * the order sent): a packet goes ahead of held DATA only when its connection
 * has nothing held; otherwise it is held behind that connection's DATA.
 * Packets of no connection (DIAL_REQ, DIAL_CLS, DRAIN) and KANAL_WINDOW
 * (credit for the peer's sending, never ordered against this side's DATA)
 * always go ahead; a DIAL_RSP precedes every DATA of its connection because
 * none exists before it is sent. DATA payloads are never copied.
 */
import { PacketType, type Packet } from '../../wire/packet.js';
import { framePacket } from './framing.js';

/** Where framed messages go: the HTTP/2 stream. */
export interface MessageSink {
  /** Bytes written and not yet taken by the connection. */
  readonly writableLength: number;
  readonly destroyed: boolean;
  write(chunk: Uint8Array, done: () => void): unknown;
}

/** Small messages gathered this far are written before more are gathered. */
const BATCH_FLUSH_BYTES = 64 * 1024;

/**
 * Bulk DATA let into the stream ahead of what the connection has taken, while
 * small messages are being sent: enough to keep the socket busy between two
 * write callbacks, little for a DIAL_RSP to wait behind.
 */
export const MIXED_WRITE_AHEAD_BYTES = 256 * 1024;

/**
 * The same while no small message has been sent for MIXED_HOLD_MS: refilling
 * the stream a quarter as often took 2-12% less proxy CPU per bulk GB than
 * 256 KiB (bench/RESULTS.md, 2026-11-24).
 */
export const BULK_WRITE_AHEAD_BYTES = 1024 * 1024;

/** How long after a small message the write-ahead stays at MIXED_WRITE_AHEAD_BYTES. */
export const MIXED_HOLD_MS = 100;

export interface WriteAhead {
  mixedBytes: number;
  bulkBytes: number;
  /** Milliseconds after a small message during which `mixedBytes` applies. */
  mixedHoldMs: number;
  /** A monotonic clock in milliseconds. */
  now(): number;
}

export const DEFAULT_WRITE_AHEAD: WriteAhead = {
  mixedBytes: MIXED_WRITE_AHEAD_BYTES,
  bulkBytes: BULK_WRITE_AHEAD_BYTES,
  mixedHoldMs: MIXED_HOLD_MS,
  now: () => performance.now(),
};

/** The connection whose order a packet must keep, or -1 for none (it may go ahead of anything). */
function orderKey(packet: Packet): number {
  switch (packet.type) {
    case PacketType.DATA:
    case PacketType.DIAL_RSP:
    case PacketType.CLOSE_REQ:
    case PacketType.CLOSE_RSP:
    case PacketType.KANAL_HALF_CLOSE:
      return packet.connectID;
    default:
      return -1;
  }
}

export class SendQueue {
  /** Framed small messages of this turn; `batchBytes` is their length, below BATCH_FLUSH_BYTES between calls. */
  private batch: Uint8Array[] = [];
  private batchBytes = 0;
  /**
   * Held messages, oldest first from `head` (entries before it are written;
   * there are none held when head === held.length):
   * held[i] is one framed message, or its header followed by its payload in
   * held[i + 1] (heldKeys[i + 1] is then PAYLOAD). `heldBytes` is their length.
   */
  private held: Uint8Array[] = [];
  private heldKeys: number[] = [];
  private head = 0;
  private heldBytes = 0;
  /** Messages held per connection; a connection with none held has no entry. */
  private readonly heldPerConnection = new Map<number, number>();
  /** When the last small message was pushed (writeAhead's clock); -Infinity before the first. */
  private smallPushedAt = Number.NEGATIVE_INFINITY;

  constructor(
    private readonly sink: MessageSink,
    private readonly onWritten: () => void,
    private readonly writeAhead: WriteAhead = DEFAULT_WRITE_AHEAD,
  ) {}

  /** Bulk DATA the stream may hold now. */
  get writeAheadBytes(): number {
    const w = this.writeAhead;
    return w.now() - this.smallPushedAt < w.mixedHoldMs ? w.mixedBytes : w.bulkBytes;
  }

  /** Bytes sent and not yet taken by the connection. */
  get queuedBytes(): number {
    return this.sink.writableLength + this.batchBytes + this.heldBytes;
  }

  push(packet: Packet): void {
    const key = orderKey(packet);
    const parts = framePacket(packet);
    if (parts.length === 1) this.smallPushedAt = this.writeAhead.now();
    if (this.head < this.held.length && key !== -1 && this.heldPerConnection.has(key)) {
      this.hold(key, parts);
      return;
    }
    if (parts.length === 1) {
      this.batch.push(parts[0]);
      this.batchBytes += parts[0].length;
      if (this.batchBytes >= BATCH_FLUSH_BYTES) this.writeBatch();
    } else if (this.head === this.held.length && this.sink.writableLength < this.writeAheadBytes) {
      this.writeWithPayload(parts[0], parts[1]);
    } else {
      this.hold(key, parts);
    }
  }

  /** Writes what this turn gathered, then held DATA as far as the stream has room. */
  flush(): void {
    this.writeBatch();
    this.pump();
  }

  /** Writes everything, held DATA included (before the stream ends). */
  flushAll(): void {
    this.writeBatch();
    this.pump(Number.POSITIVE_INFINITY);
  }

  /** Drops everything not yet written (the stream is being reset). */
  clear(): void {
    this.batch = [];
    this.batchBytes = 0;
    this.held = [];
    this.heldKeys = [];
    this.head = 0;
    this.heldBytes = 0;
    this.heldPerConnection.clear();
  }

  /** Called as the stream takes written bytes: refills it from the held DATA. */
  pump(limit?: number): void {
    if (this.head === this.held.length) return;
    // Read the clock only with DATA held: pump runs on every write callback.
    const max = limit ?? this.writeAheadBytes;
    // What this turn gathered precedes anything held (it was sent ahead of it).
    this.writeBatch();
    const held = this.held;
    const keys = this.heldKeys;
    while (this.head < held.length && this.sink.writableLength < max && !this.sink.destroyed) {
      const i = this.head;
      const key = keys[i];
      const withPayload = keys[i + 1] === PAYLOAD;
      this.head += withPayload ? 2 : 1;
      this.heldBytes -= held[i].length + (withPayload ? held[i + 1].length : 0);
      if (withPayload) this.writeWithPayload(held[i], held[i + 1]);
      else this.write(held[i]);
      if (key !== -1) {
        const n = this.heldPerConnection.get(key)! - 1;
        if (n === 0) this.heldPerConnection.delete(key);
        else this.heldPerConnection.set(key, n);
      }
    }
    if (this.head === held.length) {
      this.held = [];
      this.heldKeys = [];
      this.head = 0;
    } else if (this.head > 1024 && this.head * 2 > held.length) {
      this.held = held.slice(this.head);
      this.heldKeys = keys.slice(this.head);
      this.head = 0;
    }
  }

  private hold(key: number, parts: [Buffer] | [Buffer, Uint8Array]): void {
    for (const [i, part] of parts.entries()) {
      this.held.push(part);
      this.heldKeys.push(i === 0 ? key : PAYLOAD);
      this.heldBytes += part.length;
    }
    if (key !== -1) this.heldPerConnection.set(key, (this.heldPerConnection.get(key) ?? 0) + 1);
  }

  /** The header joins what was gathered; the payload follows it at once, uncopied. */
  private writeWithPayload(header: Uint8Array, payload: Uint8Array): void {
    this.batch.push(header);
    this.batchBytes += header.length;
    this.writeBatch();
    this.write(payload);
  }

  private writeBatch(): void {
    const n = this.batch.length;
    if (n === 0) return;
    const buf = n === 1 ? this.batch[0] : Buffer.concat(this.batch, this.batchBytes);
    this.batch = [];
    this.batchBytes = 0;
    this.write(buf);
  }

  private write(chunk: Uint8Array): void {
    if (!this.sink.destroyed) this.sink.write(chunk, this.onWritten);
  }
}

/** heldKeys entry of a payload that belongs to the header before it. */
const PAYLOAD = -2;
