/**
 * The body of one HTTP/1.1 message as the forward proxy reads it (RFC 9112
 * section 6): Content-Length, chunked (section 7.1), or, for a response,
 * until the connection closes. Strict where a proxy must be (section 11.2,
 * request smuggling): CRLF only, hex chunk sizes bounded, chunk extensions
 * and trailer sections bounded in size. The payload is handed out as it
 * comes; what follows the body belongs to the next message.
 *
 * The chunked coding is taken off and put on again by the writer
 * (chunkHeader/LAST_CHUNK): the bytes sent on are the proxy's own framing,
 * never the sender's, so an ambiguity in theirs cannot reach the next hop.
 * Trailer fields are dropped (RFC 9112 section 7.1.2 lets a recipient that
 * removes the coding discard them).
 */

/** How a message's body is delimited (RFC 9112 section 6.3). */
export type BodyFraming =
  | { readonly kind: 'none' }
  | { readonly kind: 'length'; readonly length: number }
  | { readonly kind: 'chunked' }
  /** A response without Content-Length or chunked: its body ends when the connection does. */
  | { readonly kind: 'close' };

/** Where a BodyReader is in its message. */
export type BodyState =
  | { readonly kind: 'length'; readonly left: number }
  /** Reading a chunk-size line: its value so far, its hex digits, and the line's length (extensions included). */
  | { readonly kind: 'size'; readonly size: number; readonly digits: number; readonly ext: boolean; readonly line: number }
  | { readonly kind: 'size-lf'; readonly size: number }
  | { readonly kind: 'data'; readonly left: number }
  | { readonly kind: 'data-cr' }
  | { readonly kind: 'data-lf' }
  /** After the last chunk: a trailer line, or the empty line that ends the message; `bytes` of trailers so far. */
  | { readonly kind: 'trailer'; readonly bytes: number; readonly empty: boolean }
  | { readonly kind: 'trailer-lf'; readonly bytes: number; readonly empty: boolean }
  | { readonly kind: 'close' }
  | { readonly kind: 'done' }
  | { readonly kind: 'bad'; readonly reason: string };

/** What one call of step() did: the next state, how far it read, and the payload it found there. */
interface Step {
  readonly state: BodyState;
  readonly next: number;
  readonly payload?: Buffer;
}

/** Hex digits a chunk size may have: 2^52 is beyond any body, and within a double's integers. */
const MAX_SIZE_DIGITS = 13;
/** A chunk-size line with its extensions (RFC 9112 section 7.1.1: a recipient may bound them). */
const MAX_SIZE_LINE = 4096;
/** The trailer section (as the request head is bounded). */
const MAX_TRAILER_BYTES = 16 * 1024;

const CR = 0x0d;
const LF = 0x0a;

function hexValue(b: number): number {
  if (b >= 0x30 && b <= 0x39) return b - 0x30;
  if (b >= 0x41 && b <= 0x46) return b - 0x41 + 10;
  if (b >= 0x61 && b <= 0x66) return b - 0x61 + 10;
  return -1;
}

/** Bytes allowed in a chunk extension (token, quoted-string, "=", ";", whitespace: RFC 9112 section 7.1.1) — visible ASCII, SP, HTAB. */
function isExtByte(b: number): boolean {
  return b === 0x09 || (b >= 0x20 && b < 0x7f);
}

function bad(reason: string): Step {
  return { state: { kind: 'bad', reason }, next: 0 };
}

export function initialBodyState(framing: BodyFraming): BodyState {
  switch (framing.kind) {
    case 'none':
      return { kind: 'done' };
    case 'length':
      return framing.length === 0 ? { kind: 'done' } : { kind: 'length', left: framing.length };
    case 'chunked':
      return { kind: 'size', size: 0, digits: 0, ext: false, line: 0 };
    case 'close':
      return { kind: 'close' };
  }
}

/** The one transition: reads from `buf` at `at` (< buf.length) in state `s`. */
export function step(s: BodyState, buf: Buffer, at: number): Step {
  const b = buf[at];
  switch (s.kind) {
    case 'length': {
      const n = Math.min(s.left, buf.length - at);
      const left = s.left - n;
      return { state: left === 0 ? { kind: 'done' } : { kind: 'length', left }, next: at + n, payload: buf.subarray(at, at + n) };
    }
    case 'close':
      return { state: s, next: buf.length, payload: buf.subarray(at) };
    case 'size': {
      if (s.line + 1 > MAX_SIZE_LINE) return bad(`chunk-size line longer than ${MAX_SIZE_LINE} bytes`);
      if (b === CR) {
        if (s.digits === 0) return bad('chunk size without hex digits (RFC 9112 section 7.1)');
        return { state: { kind: 'size-lf', size: s.size }, next: at + 1 };
      }
      const v = s.ext ? -1 : hexValue(b);
      if (v >= 0) {
        if (s.digits >= MAX_SIZE_DIGITS) return bad(`chunk size of more than ${MAX_SIZE_DIGITS} hex digits`);
        return { state: { ...s, size: s.size * 16 + v, digits: s.digits + 1, line: s.line + 1 }, next: at + 1 };
      }
      if (s.digits === 0) return bad('chunk size without hex digits (RFC 9112 section 7.1)');
      // Extensions (after BWS ";") are read and dropped; a bare LF or a control character is not one.
      if (!s.ext && b !== 0x3b && b !== 0x20 && b !== 0x09) return bad('invalid character in chunk size');
      if (!isExtByte(b)) return bad('invalid character in chunk extension');
      return { state: { ...s, ext: s.ext || b === 0x3b, line: s.line + 1 }, next: at + 1 };
    }
    case 'size-lf':
      if (b !== LF) return bad('a bare CR after the chunk size: expected CRLF (RFC 9112 section 2.2)');
      return {
        state: s.size === 0 ? { kind: 'trailer', bytes: 0, empty: true } : { kind: 'data', left: s.size },
        next: at + 1,
      };
    case 'data': {
      const n = Math.min(s.left, buf.length - at);
      const left = s.left - n;
      return { state: left === 0 ? { kind: 'data-cr' } : { kind: 'data', left }, next: at + n, payload: buf.subarray(at, at + n) };
    }
    case 'data-cr':
      if (b !== CR) return bad('chunk data longer than its size: expected CRLF after it');
      return { state: { kind: 'data-lf' }, next: at + 1 };
    case 'data-lf':
      if (b !== LF) return bad('a bare CR after chunk data: expected CRLF (RFC 9112 section 2.2)');
      return { state: { kind: 'size', size: 0, digits: 0, ext: false, line: 0 }, next: at + 1 };
    case 'trailer': {
      if (s.bytes + 1 > MAX_TRAILER_BYTES) return bad(`trailer section larger than ${MAX_TRAILER_BYTES} bytes`);
      if (b === CR) return { state: { kind: 'trailer-lf', bytes: s.bytes + 1, empty: s.empty }, next: at + 1 };
      // A trailer line may not start with whitespace (obs-fold) and holds no control characters.
      if (s.empty && (b === 0x20 || b === 0x09)) return bad('obs-fold in the trailer section (RFC 9112 section 5.2)');
      if (!isExtByte(b) && b < 0x80) return bad('invalid character in the trailer section');
      return { state: { kind: 'trailer', bytes: s.bytes + 1, empty: false }, next: at + 1 };
    }
    case 'trailer-lf':
      if (b !== LF) return bad('a bare CR in the trailer section: expected CRLF (RFC 9112 section 2.2)');
      return { state: s.empty ? { kind: 'done' } : { kind: 'trailer', bytes: s.bytes + 1, empty: true }, next: at + 1 };
    case 'done':
    case 'bad':
      return { state: s, next: at };
  }
}

/** What a BodyReader made of some bytes. */
export interface BodyRead {
  /** The payload found, in order (views into the input). */
  readonly payload: Buffer[];
  /** Bytes after the body's end: the next message's. Empty unless `done`. */
  readonly rest: Buffer;
  readonly done: boolean;
  /** The framing is broken: nothing more is read, and the connection must close. */
  readonly bad?: string;
}

const EMPTY = Buffer.alloc(0);

/** Reads one message's body from the bytes of a connection as they come. */
export class BodyReader {
  private s: BodyState;

  constructor(framing: BodyFraming) {
    this.s = initialBodyState(framing);
  }

  get state(): BodyState {
    return this.s;
  }

  get done(): boolean {
    return this.s.kind === 'done';
  }

  push(buf: Buffer): BodyRead {
    const payload: Buffer[] = [];
    let at = 0;
    while (at < buf.length && this.s.kind !== 'done' && this.s.kind !== 'bad') {
      const r = step(this.s, buf, at);
      this.s = r.state;
      at = r.next;
      if (r.payload && r.payload.length > 0) payload.push(r.payload);
    }
    if (this.s.kind === 'bad') return { payload, rest: EMPTY, done: false, bad: this.s.reason };
    const done = this.s.kind === 'done';
    return { payload, rest: done && at < buf.length ? buf.subarray(at) : EMPTY, done };
  }

  /** The connection ended: a close-delimited body is complete, any other is cut short. */
  end(): BodyRead {
    if (this.s.kind === 'close' || this.s.kind === 'done') {
      this.s = { kind: 'done' };
      return { payload: [], rest: EMPTY, done: true };
    }
    if (this.s.kind !== 'bad') this.s = { kind: 'bad', reason: 'the connection ended before the message body was complete' };
    return { payload: [], rest: EMPTY, done: false, bad: this.s.reason };
  }
}

/** The chunk header the proxy writes before `size` bytes of payload. */
export function chunkHeader(size: number): string {
  return `${size.toString(16)}\r\n`;
}

/** The last chunk and the empty trailer section. */
export const LAST_CHUNK = '0\r\n\r\n';
