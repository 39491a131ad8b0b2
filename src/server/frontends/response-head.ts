/**
 * A bounded parser of one HTTP/1.1 response head (status line and header
 * fields, RFC 9112 sections 4-5), as the forward proxy reads a destination's
 * answer. As strict as request-head.ts: CRLF only, no obs-fold (section 5.2
 * lets a proxy refuse it), tokens for names, no control characters in
 * values. The head is collected until its empty line (at most `maxBytes`),
 * then checked whole: a destination's answer comes in one or two reads.
 */
import type { HeaderLine } from './request-head.js';

export interface ResponseHead {
  readonly version: 'HTTP/1.0' | 'HTTP/1.1';
  readonly status: number;
  readonly reason: string;
  readonly headers: readonly HeaderLine[];
  /** The bytes after the head. */
  readonly rest: Buffer;
}

export type ResponseVerdict = { kind: 'more' } | ({ kind: 'head' } & ResponseHead) | { kind: 'bad'; reason: string };

const END = Buffer.from('\r\n\r\n', 'latin1');
const STATUS_LINE = /^HTTP\/1\.([01]) ([1-9]\d\d) ([\t\x20-\x7e\x80-\xff]*)$/;
const FIELD_NAME = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
// eslint-disable-next-line no-control-regex -- control characters are what this finds
const BAD_VALUE = /[\x00-\x08\x0a-\x1f\x7f]/;
const EMPTY = Buffer.alloc(0);
/** As Node's parser allows a message (http.maxHeadersCount 2000 is for servers that trust their peers less). */
const MAX_RESPONSE_HEADERS = 200;

export class ResponseHeadParser {
  private buf: Buffer = EMPTY;
  private verdict: ResponseVerdict | undefined;

  constructor(private readonly maxBytes: number) {}

  push(chunk: Buffer): ResponseVerdict {
    if (this.verdict) return this.verdict;
    const searchFrom = Math.max(0, this.buf.length - 3);
    this.buf = this.buf.length === 0 ? chunk : Buffer.concat([this.buf, chunk]);
    const end = this.buf.indexOf(END, searchFrom);
    if (end < 0 || end + 4 > this.maxBytes) {
      if (this.buf.length >= this.maxBytes) return this.decide({ kind: 'bad', reason: `response head larger than ${this.maxBytes} bytes` });
      return { kind: 'more' };
    }
    return this.decide(parse(this.buf.subarray(0, end), this.buf.subarray(end + 4)));
  }

  /** The destination closed before its head was complete. */
  end(): ResponseVerdict {
    return this.verdict ?? this.decide({ kind: 'bad', reason: 'the destination closed before its response head was complete' });
  }

  /** Whether any byte came. */
  get started(): boolean {
    return this.buf.length > 0 || this.verdict !== undefined;
  }

  private decide(v: ResponseVerdict): ResponseVerdict {
    this.verdict = v;
    this.buf = EMPTY;
    return v;
  }
}

function parse(head: Buffer, rest: Buffer): ResponseVerdict {
  const text = head.toString('latin1');
  // Every LF is part of a CRLF, and no CR stands alone (RFC 9112 section 2.2).
  const lines = text.split('\r\n');
  for (const l of lines) if (l.includes('\n') || l.includes('\r')) return { kind: 'bad', reason: 'a bare CR or LF in the response head' };
  const m = STATUS_LINE.exec(lines[0]);
  if (!m) return { kind: 'bad', reason: 'not an HTTP/1.x status line' };
  if (lines.length - 1 > MAX_RESPONSE_HEADERS)
    return { kind: 'bad', reason: `more than ${MAX_RESPONSE_HEADERS} header lines in the response` };
  const headers: HeaderLine[] = [];
  for (const line of lines.slice(1)) {
    if (line.startsWith(' ') || line.startsWith('\t'))
      return { kind: 'bad', reason: 'obs-fold in the response head (RFC 9112 section 5.2)' };
    const colon = line.indexOf(':');
    const name = colon < 0 ? '' : line.slice(0, colon);
    if (!FIELD_NAME.test(name)) return { kind: 'bad', reason: 'invalid header field name in the response' };
    const value = line.slice(colon + 1).replace(/^[ \t]+|[ \t]+$/g, '');
    if (BAD_VALUE.test(value)) return { kind: 'bad', reason: 'invalid character in a response header value' };
    headers.push({ name, value });
  }
  return { kind: 'head', version: m[1] === '0' ? 'HTTP/1.0' : 'HTTP/1.1', status: Number(m[2]), reason: m[3], headers, rest };
}
