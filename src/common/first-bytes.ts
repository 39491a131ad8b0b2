/**
 * Reads the first bytes of a connection until they decide something (a
 * protocol, a request), the peer ends, fails or closes, or time runs out:
 * the one reader behind the frontend's protocol sniffing and a worker's
 * reading of an agent's first request.
 *
 * Bytes go back into the socket only for a decision, and only while it is
 * open: unshift() after 'end' throws ERR_STREAM_UNSHIFT_AFTER_END_EVENT
 * (lib/internal/streams/readable.js), an 'error' that, with no listener,
 * ends the process: one client's "P" and FIN would drop every agent's tunnels.
 */
import type { Duplex } from 'node:stream';

/** What `decide` says of the bytes read so far: undefined while they say nothing yet. */
export type Decide<T> = (seen: Buffer) => T | undefined;

export type FirstBytes<T> =
  /** `bytes`: every byte read, put back into the socket when `putBack` was asked for. */
  | { kind: 'decided'; verdict: T; bytes: Buffer }
  /** The peer ended, failed or closed before the bytes decided anything (or just as they did). */
  | { kind: 'closed' }
  | { kind: 'timeout' };

export interface FirstBytesOptions {
  timeoutMs: number;
  /** Unshift the bytes read on a decision, so the next parser reads them from the first (default false). */
  putBack?: boolean;
}

/**
 * Never rejects. Once settled the socket is paused, no longer read here, and
 * its errors are swallowed until its next owner listens (in a promise
 * callback); on anything but 'decided' the caller should destroy it.
 * `decide` sees every byte read so far, once per chunk.
 */
export function readFirstBytes<T>(socket: Duplex, opts: FirstBytesOptions, decide: Decide<T>): Promise<FirstBytes<T>> {
  return new Promise<FirstBytes<T>>((resolve) => {
    let seen: Buffer = Buffer.alloc(0);
    let settled = false;
    const settle = (result: FirstBytes<T>): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      socket.off('data', onData);
      socket.off('end', onGone);
      socket.off('close', onGone);
      socket.off('error', onGone);
      socket.pause();
      socket.on('error', () => undefined);
      if (result.kind === 'decided' && socket.destroyed) return resolve({ kind: 'closed' });
      if (result.kind === 'decided' && opts.putBack && seen.length > 0) socket.unshift(seen);
      resolve(result);
    };
    const onData = (chunk: Buffer): void => {
      seen = seen.length === 0 ? chunk : Buffer.concat([seen, chunk]);
      const verdict = decide(seen);
      if (verdict !== undefined) settle({ kind: 'decided', verdict, bytes: seen });
    };
    const onGone = (): void => settle({ kind: 'closed' });
    const timer = setTimeout(() => settle({ kind: 'timeout' }), opts.timeoutMs);
    socket.on('data', onData);
    socket.once('end', onGone);
    socket.once('close', onGone);
    socket.once('error', onGone);
    if (socket.destroyed || socket.readableEnded) settle({ kind: 'closed' });
    else if (!settled) socket.resume();
  });
}
