/**
 * The `authorization` of an HTTP/2 connection's first request, read from the
 * decrypted bytes before the gRPC server sees them, so a worker can hand a
 * connection whose tenant only its token names (no server name, no
 * certificate) to the worker serving that tenant (docs/multi-tenant.md,
 * "Workers"). The header block is decoded by Node's own HTTP/2 parser
 * (nghttp2) in a throwaway session whose output is discarded; every byte
 * read is kept and given back, so the server that finally takes the
 * connection parses it from its first byte (RFC 9113 section 3.4, RFC 7541:
 * the first request's header block needs no earlier state).
 *
 * A client may wait for the server's connection preface (a SETTINGS frame)
 * before it sends any request: grpc-go does. So an empty SETTINGS is sent
 * (it changes nothing: every value stays at its default) and the client's
 * ACK of it is taken out of the bytes given back, since the server that
 * takes the connection never sent it; that server's own SETTINGS follow.
 */
import http2 from 'node:http2';
import { Duplex } from 'node:stream';
import { readFirstBytes } from '../../common/first-bytes.js';

const PREFACE = Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n', 'latin1');
const EMPTY_SETTINGS = Buffer.from([0, 0, 0, 4, 0, 0, 0, 0, 0]);
const FRAME_HEADER = 9;
const SETTINGS = 0x4;
const HEADERS = 0x1;
const CONTINUATION = 0x9;
const ACK = 0x1;
const END_HEADERS = 0x4;

/** What a first request's headers weigh at most (a service account token is ~1 KiB; upstream caps a JWT at 8 KiB claims). */
export const MAX_FIRST_REQUEST_BYTES = 64 * 1024;

export type FirstRequest =
  /** Its `authorization` values (often one, none without a token); `replay`: every byte read but the ACK of our SETTINGS. */
  | { kind: 'request'; authorization: string[]; replay: Buffer }
  /** Not HTTP/2, or it did not fit in time and size: the caller closes it. */
  | { kind: 'none'; why: string };

/** Frame-level progress over the bytes read so far. */
interface Scan {
  /** Offsets [start, end) of the client's ACK of our SETTINGS, once seen. */
  ack?: [number, number];
  /** End offset of the first request's header block (its END_HEADERS frame), once complete. */
  headersEnd?: number;
}

function scan(bytes: Buffer): Scan | 'bad' {
  if (!bytes.subarray(0, Math.min(bytes.length, PREFACE.length)).equals(PREFACE.subarray(0, Math.min(bytes.length, PREFACE.length))))
    return 'bad';
  const out: Scan = {};
  let pos = PREFACE.length;
  let inHeaders = false;
  while (pos + FRAME_HEADER <= bytes.length) {
    const length = bytes.readUIntBE(pos, 3);
    const type = bytes[pos + 3];
    const flags = bytes[pos + 4];
    const end = pos + FRAME_HEADER + length;
    if (end > bytes.length) break;
    if (type === SETTINGS && flags & ACK && out.ack === undefined) out.ack = [pos, end];
    if (out.headersEnd === undefined && (type === HEADERS || (inHeaders && type === CONTINUATION))) {
      inHeaders = true;
      if (flags & END_HEADERS) out.headersEnd = end;
    }
    pos = end;
  }
  return out;
}

/** Feeds `bytes` to a throwaway HTTP/2 server session; resolves with the first request's raw headers. */
function parseHeaders(bytes: Buffer, timeoutMs: number): Promise<string[] | undefined> {
  return new Promise((resolve) => {
    const probe = http2.createServer({ maxSessionMemory: 1 });
    let done = false;
    const end = new Duplex({
      read() {},
      write(_chunk, _encoding, callback) {
        callback(); // the probe's own frames go nowhere
      },
    });
    const finish = (raw: string[] | undefined): void => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      resolve(raw);
      end.destroy();
      probe.close();
    };
    const timer = setTimeout(() => finish(undefined), timeoutMs);
    probe.on('stream', (stream, _headers, _flags, raw: string[]) => {
      stream.on('error', () => undefined);
      finish(raw);
    });
    probe.on('session', (s) => {
      s.on('error', () => finish(undefined));
      s.on('close', () => finish(undefined));
    });
    probe.on('sessionError', () => finish(undefined));
    end.on('error', () => finish(undefined));
    probe.emit('connection', end);
    end.push(bytes);
  });
}

/** Where the bytes read so far stand: the first request complete (with our SETTINGS acknowledged), or not a request to read. */
type Read = { kind: 'complete'; replay: Buffer; headersEnd: number } | { kind: 'none'; why: string };

/**
 * Reads `socket` (decrypted, paused or not) until its first request's
 * headers are complete and our SETTINGS is acknowledged: at most
 * MAX_FIRST_REQUEST_BYTES, within `timeoutMs` (common/first-bytes.ts).
 * Leaves the socket paused and nothing put back: the caller unshifts
 * `replay` before handing it on.
 */
export async function readFirstRequest(socket: Duplex, timeoutMs: number): Promise<FirstRequest> {
  let settingsSent = false;
  const read = await readFirstBytes<Read>(socket, { timeoutMs }, (seen) => {
    if (seen.length > MAX_FIRST_REQUEST_BYTES) return { kind: 'none', why: 'its first request is too large' };
    const s = scan(seen);
    if (s === 'bad') return { kind: 'none', why: 'not HTTP/2' };
    if (!settingsSent && seen.length >= PREFACE.length) {
      settingsSent = true;
      socket.write(EMPTY_SETTINGS);
    }
    if (s.headersEnd === undefined || s.ack === undefined) return undefined;
    const [a, b] = s.ack;
    // The headers' end moves back by the ACK's length when the ACK came before them.
    const headersEnd = s.headersEnd > a ? s.headersEnd - (b - a) : s.headersEnd;
    return { kind: 'complete', replay: Buffer.concat([seen.subarray(0, a), seen.subarray(b)]), headersEnd };
  });
  if (read.kind === 'closed') return { kind: 'none', why: 'it closed' };
  if (read.kind === 'timeout') return { kind: 'none', why: 'no request in time' };
  const verdict = read.verdict;
  if (verdict.kind === 'none') return verdict;
  const raw = await parseHeaders(verdict.replay.subarray(0, verdict.headersEnd), timeoutMs);
  if (!raw) return { kind: 'none', why: 'its first request could not be parsed' };
  const authorization: string[] = [];
  for (let i = 0; i + 1 < raw.length; i += 2) if (raw[i].toLowerCase() === 'authorization') authorization.push(raw[i + 1]);
  return { kind: 'request', authorization, replay: verdict.replay };
}
