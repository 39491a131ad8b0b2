/**
 * A bounded, incremental parser of one HTTP/1.x request head (request line
 * and header fields, RFC 9112 sections 2-3 and 5) for the HTTP front doors:
 * method, request target and its form, version and the header lines, what a
 * CONNECT proxy and a forward proxy act on.
 * node:http built a parser, an IncomingMessage and timers per connection to
 * read one line (about 50 µs of the server's CPU per dial,
 * bench/notes/dial-profile.md finding 3); this reads the bytes as they come,
 * once each, and keeps at most `maxBytes` of head.
 *
 * Strict where a proxy must be (RFC 9112 section 11.2, request smuggling):
 * CRLF line ends only (a bare CR is refused, section 2.2), no obs-fold
 * (section 5.2), no whitespace before a field's colon, no control
 * characters in values, a target in the form its method takes (section 3.2).
 * Bounded in bytes and in header lines. Refusals carry the error codes of
 * Node's parser (llhttp), which operators already see in logs.
 */

/**
 * The request target's form (RFC 9112 section 3.2): authority for CONNECT (host:port, checked by
 * whoever dials it), asterisk for a server-wide OPTIONS, otherwise origin ("/path?query") or
 * absolute ("scheme:...", what a forward proxy is sent).
 */
export type TargetForm = 'origin' | 'absolute' | 'authority' | 'asterisk';

/** One header line: its name as sent (compare case-insensitively) and its value without the whitespace around it (RFC 9110 section 5.5). */
export interface HeaderLine {
  readonly name: string;
  readonly value: string;
}

export interface RequestHead {
  readonly method: string;
  readonly target: string;
  readonly form: TargetForm;
  readonly version: 'HTTP/1.0' | 'HTTP/1.1';
  /** In the order sent; at most the parser's maxHeaders. */
  readonly headers: readonly HeaderLine[];
  /** The bytes that followed the head. */
  readonly rest: Buffer;
}

export type HeadVerdict =
  /** Incomplete: feed more bytes. */
  | { kind: 'more' }
  /** Complete. */
  | ({ kind: 'head' } & RequestHead)
  /** Not a valid head, or too large, or too many header lines (431). */
  | { kind: 'bad'; status: 400 | 431; code: string; reason: string };

/** Header lines a head may carry (Node's http server allows 2000; a CONNECT needs a handful). */
export const DEFAULT_MAX_HEADERS = 100;

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
const SLASH = 0x2f;

/** scheme ":" at the start of an absolute-URI (RFC 3986 section 3.1). */
const SCHEME = /^[A-Za-z][A-Za-z0-9+.-]*:/;

/** The form `target` takes for `method`, or undefined when it fits none (RFC 9112 section 3.2). */
function targetForm(method: string, target: string): TargetForm | undefined {
  if (method === 'CONNECT') return 'authority';
  if (target.charCodeAt(0) === SLASH) return 'origin';
  if (target === '*') return method === 'OPTIONS' ? 'asterisk' : undefined;
  return SCHEME.test(target) ? 'absolute' : undefined;
}

function isWhitespace(b: number): boolean {
  return b === SP || b === HTAB;
}

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
  /** The current header line: where its name starts, where its colon is. */
  private fieldStart = 0;
  private colon = 0;
  /** Set at the end of the request line. */
  private form: TargetForm = 'origin';
  private headers: HeaderLine[] = [];
  /** Set once push() or end() returned a verdict other than 'more': later calls return it again. */
  private verdict: HeadVerdict | undefined;

  /** `maxBytes`: the largest head (request line and header lines); `maxHeaders`: the most header lines. */
  constructor(
    private readonly maxBytes: number,
    private readonly maxHeaders = DEFAULT_MAX_HEADERS,
  ) {}

  /** Adds the next bytes from the client. */
  push(chunk: Buffer): HeadVerdict {
    if (this.verdict) return this.verdict;
    this.buf = this.buf.length === 0 ? chunk : Buffer.concat([this.buf, chunk]);
    return this.scan();
  }

  /** Whether any byte of a head came (a connection idle between requests has none). */
  get started(): boolean {
    return this.buf.length > 0 || this.verdict !== undefined;
  }

  /** The client ended (FIN) after the bytes pushed so far. */
  end(): HeadVerdict {
    return this.verdict ?? this.decide(bad(400, 'HPE_INVALID_EOF_STATE', 'the client ended before its request head was complete'));
  }

  private decide(verdict: HeadVerdict): HeadVerdict {
    this.verdict = verdict;
    this.buf = EMPTY;
    this.headers = [];
    return verdict;
  }

  /** The header line that ends before the CR at `cr`. */
  private field(buf: Buffer, cr: number): void {
    let start = this.colon + 1;
    let end = cr;
    while (start < end && isWhitespace(buf[start])) start++;
    while (end > start && isWhitespace(buf[end - 1])) end--;
    this.headers.push({ name: buf.toString('latin1', this.fieldStart, this.colon), value: buf.toString('latin1', start, end) });
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
          } else if (b === CR) {
            const method = buf.toString('latin1', this.methodStart, this.methodEnd);
            const form = targetForm(method, buf.toString('latin1', this.methodEnd + 1, this.targetEnd));
            if (!form)
              return this.decide(
                bad(400, 'HPE_INVALID_URL', `request target in none of the forms ${truncate(method)} takes (RFC 9112 section 3.2)`),
              );
            this.form = form;
            this.state = State.VersionLf;
          } else return this.decide(bad(400, 'HPE_CR_EXPECTED', 'expected CRLF after the HTTP version'));
          break;
        }
        case State.VersionLf:
        case State.FieldValueLf:
          if (b !== LF) return this.decide(bad(400, 'HPE_LF_EXPECTED', 'a bare CR: expected LF after it (RFC 9112 section 2.2)'));
          this.state = State.FieldStart;
          break;
        case State.FieldStart:
          if (b === CR) this.state = State.EndLf;
          else if (TCHAR[b]) {
            if (this.headers.length >= this.maxHeaders)
              return this.decide(bad(431, 'HPE_HEADER_OVERFLOW', `more than ${this.maxHeaders} header lines`));
            this.fieldStart = i;
            this.state = State.FieldName;
          } else if (isWhitespace(b))
            return this.decide(
              bad(
                400,
                'HPE_INVALID_HEADER_TOKEN',
                this.headers.length === 0
                  ? 'whitespace after the request line (RFC 9112 section 2.2)'
                  : 'obs-fold: a header line continued on the next (RFC 9112 section 5.2)',
              ),
            );
          // A bare LF, or a name starting with what no token holds.
          else return this.decide(bad(400, 'HPE_INVALID_HEADER_TOKEN', 'invalid header field name'));
          break;
        case State.FieldName:
          if (b === COLON) {
            this.colon = i;
            this.state = State.FieldValue;
          } else if (!TCHAR[b]) return this.decide(bad(400, 'HPE_INVALID_HEADER_TOKEN', 'invalid header field name'));
          break;
        case State.FieldValue:
          if (b === CR) {
            this.field(buf, i);
            this.state = State.FieldValueLf;
          } else if (!isFieldValueByte(b))
            return this.decide(bad(400, 'HPE_INVALID_HEADER_TOKEN', 'invalid character in header field value'));
          break;
        case State.EndLf: {
          if (b !== LF) return this.decide(bad(400, 'HPE_LF_EXPECTED', 'expected LF after CR'));
          const method = buf.toString('latin1', this.methodStart, this.methodEnd);
          const target = buf.toString('latin1', this.methodEnd + 1, this.targetEnd);
          const head: HeadVerdict = {
            kind: 'head',
            method,
            target,
            form: this.form,
            version: buf[this.versionStart + VERSION_PREFIX.length] === 0x30 ? 'HTTP/1.0' : 'HTTP/1.1',
            headers: this.headers,
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

/** A method in a reason text: a token, but of any length. */
function truncate(method: string): string {
  return method.length > 32 ? `${method.slice(0, 32)}…` : method;
}

function bad(status: 400 | 431, code: string, reason: string): HeadVerdict {
  return { kind: 'bad', status, code, reason };
}
