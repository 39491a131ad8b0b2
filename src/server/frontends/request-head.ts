/**
 * A bounded, incremental parser of one HTTP/1.x request head (request line
 * and header fields, RFC 9112 sections 2-3 and 5) for the CONNECT frontend.
 * node:http built a parser, an IncomingMessage and timers per connection to
 * read one line (about 50 µs of the server's CPU per dial,
 * bench/notes/dial-profile.md finding 3); this reads the bytes as they come,
 * once each, and keeps at most `maxBytes` of head.
 *
 * Strict where a proxy must be (RFC 9112 section 11.2, request smuggling):
 * CRLF line ends only, no obs-fold, no whitespace before a field's colon,
 * no control characters in values. Refusals carry the error codes of
 * Node's parser (llhttp), which operators already see in logs.
 */

export type HeadVerdict =
  /** Incomplete: feed more bytes. */
  | { kind: 'more' }
  /** Complete; `rest` holds the bytes that followed the head. */
  | { kind: 'head'; method: string; target: string; rest: Buffer }
  /** Not a valid head, or too large (431). */
  | { kind: 'bad'; status: 400 | 431; code: string; reason: string };

const enum State {
  /** Before the request line: empty lines (CRLF) are skipped (RFC 9112 section 2.2). */
  Start,
  StartLf,
  Method,
  Target,
  Version,
  VersionLf,
  FieldStart,
  FieldName,
  FieldValue,
  FieldValueLf,
  EndLf,
}

const CR = 0x0d;
const LF = 0x0a;
const SP = 0x20;
const HTAB = 0x09;
const COLON = 0x3a;
const VERSION_PREFIX = Buffer.from('HTTP/1.', 'latin1');

/** token characters (RFC 9110 section 5.6.2). */
const TCHAR = new Uint8Array(256);
for (const c of "!#$%&'*+-.^_`|~") TCHAR[c.charCodeAt(0)] = 1;
for (let c = 0x30; c <= 0x39; c++) TCHAR[c] = 1;
for (let c = 0x41; c <= 0x5a; c++) TCHAR[c] = 1;
for (let c = 0x61; c <= 0x7a; c++) TCHAR[c] = 1;

/** Field value characters: HTAB, SP, VCHAR, obs-text (RFC 9110 section 5.5). */
function isFieldValueByte(b: number): boolean {
  return b === HTAB || (b >= SP && b !== 0x7f);
}

/** request-target characters: visible ASCII (RFC 9112 section 3.2). */
function isTargetByte(b: number): boolean {
  return b > SP && b < 0x7f;
}

const EMPTY = Buffer.alloc(0);

export class RequestHeadParser {
  /** The bytes received so far, at most maxBytes plus one chunk; released once a verdict is given. */
  private buf: Buffer = EMPTY;
  /** The next byte of `buf` to examine: every byte is examined once. */
  private pos = 0;
  private state = State.Start;
  private methodStart = 0;
  private methodEnd = 0;
  private targetEnd = 0;
  private versionStart = 0;
  /** Set once push() or end() returned a verdict other than 'more': later calls return it again. */
  private verdict: HeadVerdict | undefined;

  constructor(private readonly maxBytes: number) {}

  /** Adds the next bytes from the client. */
  push(chunk: Buffer): HeadVerdict {
    if (this.verdict) return this.verdict;
    this.buf = this.buf.length === 0 ? chunk : Buffer.concat([this.buf, chunk]);
    return this.scan();
  }

  /** The client ended (FIN) after the bytes pushed so far. */
  end(): HeadVerdict {
    return this.verdict ?? this.decide(bad(400, 'HPE_INVALID_EOF_STATE', 'the client ended before its request head was complete'));
  }

  private decide(verdict: HeadVerdict): HeadVerdict {
    this.verdict = verdict;
    this.buf = EMPTY;
    return verdict;
  }

  private scan(): HeadVerdict {
    const buf = this.buf;
    const stop = Math.min(buf.length, this.maxBytes);
    for (let i = this.pos; i < stop; i++) {
      const b = buf[i];
      switch (this.state) {
        case State.Start:
          if (b === CR) this.state = State.StartLf;
          else if (TCHAR[b]) {
            this.methodStart = i;
            this.state = State.Method;
          } else return this.decide(bad(400, 'HPE_INVALID_METHOD', 'invalid method'));
          break;
        case State.StartLf:
          if (b !== LF) return this.decide(bad(400, 'HPE_LF_EXPECTED', 'expected LF after CR'));
          this.state = State.Start;
          break;
        case State.Method:
          if (b === SP) {
            this.methodEnd = i;
            this.state = State.Target;
          } else if (!TCHAR[b]) return this.decide(bad(400, 'HPE_INVALID_METHOD', 'invalid method'));
          break;
        case State.Target:
          if (b === SP) {
            if (i === this.methodEnd + 1) return this.decide(bad(400, 'HPE_INVALID_URL', 'empty request target'));
            this.targetEnd = i;
            this.versionStart = i + 1;
            this.state = State.Version;
          } else if (!isTargetByte(b)) return this.decide(bad(400, 'HPE_INVALID_URL', 'invalid character in request target'));
          break;
        case State.Version: {
          const at = i - this.versionStart;
          if (at < VERSION_PREFIX.length) {
            if (b !== VERSION_PREFIX[at]) return this.decide(bad(400, 'HPE_INVALID_VERSION', 'expected HTTP/1.0 or HTTP/1.1'));
          } else if (at === VERSION_PREFIX.length) {
            if (b !== 0x30 && b !== 0x31) return this.decide(bad(400, 'HPE_INVALID_VERSION', 'expected HTTP/1.0 or HTTP/1.1'));
          } else if (b === CR) this.state = State.VersionLf;
          else return this.decide(bad(400, 'HPE_CR_EXPECTED', 'expected CRLF after the HTTP version'));
          break;
        }
        case State.VersionLf:
        case State.FieldValueLf:
          if (b !== LF) return this.decide(bad(400, 'HPE_LF_EXPECTED', 'expected LF after CR'));
          this.state = State.FieldStart;
          break;
        case State.FieldStart:
          if (b === CR) this.state = State.EndLf;
          else if (TCHAR[b]) this.state = State.FieldName;
          // Includes obs-fold (a line starting with SP or HTAB) and a bare LF.
          else return this.decide(bad(400, 'HPE_INVALID_HEADER_TOKEN', 'invalid header field name'));
          break;
        case State.FieldName:
          if (b === COLON) this.state = State.FieldValue;
          else if (!TCHAR[b]) return this.decide(bad(400, 'HPE_INVALID_HEADER_TOKEN', 'invalid header field name'));
          break;
        case State.FieldValue:
          if (b === CR) this.state = State.FieldValueLf;
          else if (!isFieldValueByte(b))
            return this.decide(bad(400, 'HPE_INVALID_HEADER_TOKEN', 'invalid character in header field value'));
          break;
        case State.EndLf: {
          if (b !== LF) return this.decide(bad(400, 'HPE_LF_EXPECTED', 'expected LF after CR'));
          const head: HeadVerdict = {
            kind: 'head',
            method: buf.toString('latin1', this.methodStart, this.methodEnd),
            target: buf.toString('latin1', this.methodEnd + 1, this.targetEnd),
            rest: i + 1 < buf.length ? buf.subarray(i + 1) : EMPTY,
          };
          return this.decide(head);
        }
      }
    }
    this.pos = stop;
    if (stop === this.maxBytes) return this.decide(bad(431, 'HPE_HEADER_OVERFLOW', `request head larger than ${this.maxBytes} bytes`));
    return { kind: 'more' };
  }
}

function bad(status: 400 | 431, code: string, reason: string): HeadVerdict {
  return { kind: 'bad', status, code, reason };
}
