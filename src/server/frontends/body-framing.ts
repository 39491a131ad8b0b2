/**
 * Which framing a message's header fields give its body (RFC 9112 section
 * 6.3), decided strictly for the forward proxy: every ambiguity a request
 * smuggler relies on (section 11.2) is refused rather than resolved one way,
 * since the next hop might resolve it the other.
 */
import type { HeaderLine } from './request-head.js';
import type { BodyFraming } from './http-framing.js';

/** A framing, or why there is none: `status` is what a request gets (400, or 501 for a coding not implemented). */
export type FramingVerdict =
  | { readonly ok: true; readonly framing: BodyFraming }
  | { readonly ok: false; readonly status: 400 | 501 | 502; readonly code: string; readonly reason: string };

/** The largest Content-Length taken: beyond a double's integers it could not be counted down exactly. */
const MAX_CONTENT_LENGTH = Number.MAX_SAFE_INTEGER;

function fieldValues(headers: readonly HeaderLine[], name: string): string[] {
  const out: string[] = [];
  for (const h of headers) if (h.name.toLowerCase() === name) out.push(h.value);
  return out;
}

/** The list elements of every `name` line (RFC 9110 section 5.6.1), trimmed, empty ones dropped. */
export function listValues(headers: readonly HeaderLine[], name: string): string[] {
  return fieldValues(headers, name)
    .flatMap((v) => v.split(','))
    .map((v) => v.trim())
    .filter((v) => v.length > 0);
}

type LengthVerdict = { ok: true; length: number | undefined } | { ok: false; reason: string };

/** Content-Length: one value, however often repeated (RFC 9112 section 6.3 item 5); digits only. */
function contentLength(headers: readonly HeaderLine[]): LengthVerdict {
  const lines = fieldValues(headers, 'content-length');
  if (lines.length === 0) return { ok: true, length: undefined };
  const values = lines.flatMap((v) => v.split(',')).map((v) => v.trim());
  const first = values[0];
  if (!/^\d{1,16}$/.test(first)) return { ok: false, reason: `Content-Length ${JSON.stringify(first.slice(0, 20))} is not a number` };
  if (values.some((v) => v !== first)) return { ok: false, reason: 'several differing Content-Length values' };
  const length = Number(first);
  if (length > MAX_CONTENT_LENGTH) return { ok: false, reason: 'Content-Length too large' };
  return { ok: true, length };
}

/** A request's body (RFC 9112 section 6.3 items 3-6): no framing means no body. */
export function requestFraming(version: 'HTTP/1.0' | 'HTTP/1.1', headers: readonly HeaderLine[]): FramingVerdict {
  const te = listValues(headers, 'transfer-encoding').map((v) => v.toLowerCase());
  const hasTe = headers.some((h) => h.name.toLowerCase() === 'transfer-encoding');
  const cl = contentLength(headers);
  if (hasTe && fieldValues(headers, 'content-length').length > 0)
    return refuse(400, 'HPE_UNEXPECTED_CONTENT_LENGTH', 'both Transfer-Encoding and Content-Length: send one (RFC 9112 section 6.3)');
  if (hasTe) {
    // RFC 9112 section 6.1: Transfer-Encoding in an HTTP/1.0 message is faulty framing.
    if (version === 'HTTP/1.0')
      return refuse(400, 'HPE_INVALID_TRANSFER_ENCODING', 'Transfer-Encoding in an HTTP/1.0 request (RFC 9112 section 6.1)');
    if (te.length === 0 || te[te.length - 1] !== 'chunked')
      return refuse(
        400,
        'HPE_INVALID_TRANSFER_ENCODING',
        'Transfer-Encoding must end in chunked (RFC 9112 section 6.3); send "Transfer-Encoding: chunked"',
      );
    if (te.length > 1)
      return refuse(
        501,
        'HPE_INVALID_TRANSFER_ENCODING',
        `Transfer-Encoding ${JSON.stringify(te.join(', ').slice(0, 64))} not implemented: send "chunked" alone`,
      );
    return { ok: true, framing: { kind: 'chunked' } };
  }
  if (!cl.ok) return refuse(400, 'HPE_INVALID_CONTENT_LENGTH', `${cl.reason} (RFC 9112 section 6.3)`);
  if (cl.length === undefined || cl.length === 0) return { ok: true, framing: { kind: 'none' } };
  return { ok: true, framing: { kind: 'length', length: cl.length } };
}

/** A response's body (RFC 9112 section 6.3 items 1-7) to a request of `method`; a faulty one is the destination's (502). */
export function responseFraming(method: string, status: number, headers: readonly HeaderLine[]): FramingVerdict {
  if (method === 'HEAD' || (status >= 100 && status < 200) || status === 204 || status === 304)
    return { ok: true, framing: { kind: 'none' } };
  const hasTe = headers.some((h) => h.name.toLowerCase() === 'transfer-encoding');
  // Both is what response splitting looks like (section 6.3 item 3: "ought to be handled as an error").
  if (hasTe && fieldValues(headers, 'content-length').length > 0)
    return refuse(502, 'HPE_UNEXPECTED_CONTENT_LENGTH', 'the destination sent both Transfer-Encoding and Content-Length');
  if (hasTe) {
    const te = listValues(headers, 'transfer-encoding').map((v) => v.toLowerCase());
    if (te.length === 1 && te[0] === 'chunked') return { ok: true, framing: { kind: 'chunked' } };
    // Item 4: not chunked last: the body runs to the close; any other coding is passed on only as a close-delimited whole.
    if (te[te.length - 1] !== 'chunked') return { ok: true, framing: { kind: 'close' } };
    return refuse(
      502,
      'HPE_INVALID_TRANSFER_ENCODING',
      `the destination sent Transfer-Encoding ${JSON.stringify(te.join(', ').slice(0, 64))}, which this proxy does not decode`,
    );
  }
  const cl = contentLength(headers);
  if (!cl.ok) return refuse(502, 'HPE_INVALID_CONTENT_LENGTH', `the destination sent ${cl.reason}`);
  if (cl.length === undefined) return { ok: true, framing: { kind: 'close' } };
  return { ok: true, framing: { kind: 'length', length: cl.length } };
}

/** `code`: llhttp's name for the fault, as request-head.ts gives its own. */
function refuse(status: 400 | 501 | 502, code: string, reason: string): FramingVerdict {
  return { ok: false, status, code, reason };
}
