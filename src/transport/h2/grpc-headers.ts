/**
 * The header side of gRPC over HTTP/2 (PROTOCOL-HTTP2.md): custom metadata
 * in and out, grpc-message percent-encoding, grpc-timeout, and the mapping of
 * HTTP statuses and RST_STREAM codes to gRPC statuses.
 */
import { constants as h2c } from 'node:http2';
import type { MetadataMap } from '../../wire/metadata.js';
import { GrpcStatus } from '../grpc-status.js';

export const GRPC_CONTENT_TYPE = 'application/grpc';

/** PERMISSION_DENIED is not among the codes Kanal itself uses. */
const PERMISSION_DENIED = 7 as GrpcStatus;

/** Headers that are protocol, not metadata: never copied into a MetadataMap or from one. */
const RESERVED = new Set([
  'content-type',
  'te',
  'content-length',
  'transfer-encoding',
  'connection',
  'keep-alive',
  'proxy-connection',
  'upgrade',
  'host',
]);

function isReserved(key: string): boolean {
  return key.charCodeAt(0) === 0x3a /* ':' */ || key.startsWith('grpc-') || RESERVED.has(key);
}

/** `application/grpc`, `application/grpc+proto`, `application/grpc;…`. */
export function isGrpcContentType(value: string | string[] | undefined): boolean {
  if (typeof value !== 'string') return false;
  const v = value.toLowerCase();
  if (!v.startsWith(GRPC_CONTENT_TYPE)) return false;
  const next = v.charAt(GRPC_CONTENT_TYPE.length);
  return next === '' || next === '+' || next === ';';
}

/** Normalises a -bin value (padded or unpadded base64) to padded base64. */
function normaliseBinary(value: string): string {
  return Buffer.from(value.trim(), 'base64').toString('base64');
}

/**
 * Builds a MetadataMap from a flat [name, value, name, value, …] header list
 * (Node's rawHeaders), so repeated keys keep their values apart. `-bin`
 * values are split on commas and normalised to padded base64; pseudo-headers
 * and reserved keys (grpc-*, content-type, te, …) are skipped.
 */
export function metadataFromRawHeaders(raw: readonly string[]): MetadataMap {
  const out = new Map<string, string[]>();
  for (let i = 0; i + 1 < raw.length; i += 2) {
    const key = raw[i].toLowerCase();
    if (isReserved(key)) continue;
    const value = raw[i + 1];
    let list = out.get(key);
    if (list === undefined) out.set(key, (list = []));
    if (key.endsWith('-bin')) {
      for (const part of value.split(',')) if (part.trim() !== '') list.push(normaliseBinary(part));
    } else {
      list.push(value);
    }
  }
  return out;
}

/**
 * Adds custom metadata to an outgoing header block. Keys are lower-cased;
 * reserved keys are dropped (they belong to the transport); `-bin` values are
 * taken as base64 text (Kanal's representation of binary metadata) and sent
 * normalised.
 */
export function addMetadataHeaders(target: Record<string, string>, metadata: Record<string, string>): void {
  for (const [k, v] of Object.entries(metadata)) {
    const key = k.toLowerCase();
    if (isReserved(key)) continue;
    target[key] = key.endsWith('-bin') ? normaliseBinary(v) : v;
  }
}

// ---------- grpc-message ----------

/** Bytes outside 0x20–0x7E and '%' are sent as %XX of their UTF-8 encoding. */
export function encodeGrpcMessage(message: string): string {
  if (/^[\x20-\x24\x26-\x7e]*$/.test(message)) return message;
  let out = '';
  for (const b of Buffer.from(message, 'utf8')) {
    if (b >= 0x20 && b <= 0x7e && b !== 0x25) out += String.fromCharCode(b);
    else out += '%' + (b < 16 ? '0' : '') + b.toString(16).toUpperCase();
  }
  return out;
}

function hexValue(c: number): number {
  if (c >= 0x30 && c <= 0x39) return c - 0x30;
  if (c >= 0x41 && c <= 0x46) return c - 0x41 + 10;
  if (c >= 0x61 && c <= 0x66) return c - 0x61 + 10;
  return -1;
}

/** Percent-decodes; malformed escapes are kept literally, bad UTF-8 is replaced. */
export function decodeGrpcMessage(value: string): string {
  if (!value.includes('%')) return value;
  const src = Buffer.from(value, 'latin1');
  const out = Buffer.allocUnsafe(src.length);
  let n = 0;
  for (let i = 0; i < src.length; i++) {
    const c = src[i];
    if (c === 0x25 && i + 2 < src.length) {
      const hi = hexValue(src[i + 1]);
      const lo = hexValue(src[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out[n++] = hi * 16 + lo;
        i += 2;
        continue;
      }
    }
    out[n++] = c;
  }
  return out.subarray(0, n).toString('utf8');
}

// ---------- grpc-timeout ----------

const TIMEOUT_UNIT_MS: Record<string, number> = {
  H: 3_600_000,
  M: 60_000,
  S: 1000,
  m: 1,
  u: 1e-3,
  n: 1e-6,
};

/**
 * Parses `grpc-timeout` ("TimeoutValue TimeoutUnit", at most 8 digits) into
 * milliseconds. Returns undefined for a malformed value.
 */
export function parseGrpcTimeout(value: string): number | undefined {
  const m = /^(\d{1,8})([HMSmun])$/.exec(value);
  if (!m) return undefined;
  return Number(m[1]) * TIMEOUT_UNIT_MS[m[2]];
}

/** Encodes a timeout in milliseconds as a `grpc-timeout` value. */
export function formatGrpcTimeout(ms: number): string {
  const v = Math.max(0, Math.ceil(ms));
  if (v < 1e8) return `${v}m`;
  const s = Math.ceil(v / 1000);
  if (s < 1e8) return `${s}S`;
  return `${Math.min(99_999_999, Math.ceil(s / 3600))}H`;
}

// ---------- statuses ----------

/** grpc-status header value → code; missing or malformed → undefined. */
export function parseGrpcStatus(value: string | string[] | undefined): GrpcStatus | undefined {
  if (typeof value !== 'string' || !/^\d{1,3}$/.test(value)) return undefined;
  return Number(value);
}

/** Non-200 HTTP responses without grpc-status (PROTOCOL-HTTP2.md / http-grpc-status-mapping.md). */
export function grpcStatusFromHttp(status: number): GrpcStatus {
  switch (status) {
    case 400:
      return GrpcStatus.INTERNAL;
    case 401:
      return GrpcStatus.UNAUTHENTICATED;
    case 403:
      return PERMISSION_DENIED;
    case 404:
      return GrpcStatus.UNIMPLEMENTED;
    case 429:
    case 502:
    case 503:
    case 504:
      return GrpcStatus.UNAVAILABLE;
    default:
      return GrpcStatus.UNKNOWN;
  }
}

/** RST_STREAM error code received from the peer → gRPC status. */
export function grpcStatusFromRstCode(code: number): GrpcStatus {
  switch (code) {
    case h2c.NGHTTP2_REFUSED_STREAM:
      return GrpcStatus.UNAVAILABLE;
    case h2c.NGHTTP2_CANCEL:
      return GrpcStatus.CANCELLED;
    case h2c.NGHTTP2_ENHANCE_YOUR_CALM:
      return GrpcStatus.RESOURCE_EXHAUSTED;
    case h2c.NGHTTP2_INADEQUATE_SECURITY:
      return PERMISSION_DENIED;
    default:
      return GrpcStatus.INTERNAL;
  }
}
