/**
 * Chooses a connection's front door by its first bytes (frontend.ts), then
 * puts the bytes back so the door's own parser sees them from the first
 * (common/first-bytes.ts: never after the client's end).
 */
import type { Duplex } from 'node:stream';
import { readFirstBytes } from '../../common/first-bytes.js';
import type { Frontend } from './frontend.js';

/** Bytes the doors may ask for before one claims the connection (the HTTP/2 preface is 24). */
export const MAX_SNIFF_BYTES = 1024;

export type SniffResult<D> =
  /** `door` claimed it: the socket is paused with the bytes put back. */
  | { kind: 'door'; door: D }
  /** No door claims it (within MAX_SNIFF_BYTES). */
  | { kind: 'unknown' }
  /** The client ended, failed or closed before its bytes chose a door. */
  | { kind: 'closed' }
  | { kind: 'timeout' };

/** The first door, in order, not to say 'no': its 'yes' decides, its 'more' waits for more bytes. */
function choose<D extends Pick<Frontend, 'recognises'>>(doors: readonly D[], seen: Buffer): SniffResult<D> | undefined {
  for (const door of doors) {
    const said = door.recognises(seen);
    if (said === 'yes') return { kind: 'door', door };
    if (said === 'more') return seen.length >= MAX_SNIFF_BYTES ? { kind: 'unknown' } : undefined;
  }
  return { kind: 'unknown' };
}

/** Resolves once the first bytes choose among `doors`, the client ends, fails or closes, or `timeoutMs` passes. Never rejects; on anything but 'door' the caller should destroy the socket. */
export async function sniffProtocol<D extends Pick<Frontend, 'recognises'>>(
  socket: Duplex,
  timeoutMs: number,
  doors: readonly D[],
): Promise<SniffResult<D>> {
  const read = await readFirstBytes(socket, { timeoutMs, putBack: true }, (seen) => choose(doors, seen));
  return read.kind === 'decided' ? read.verdict : read;
}
