/**
 * Tells an HTTP/2 connection (gRPC) from an HTTP/1.1 one (CONNECT) by its
 * first bytes, then puts the bytes back so the real parser sees them.
 *
 * Bytes go back only for a verdict another parser will read. A client that
 * ends or fails before the bytes decide anything ('closed') gets nothing put
 * back: unshift() after 'end' throws ERR_STREAM_UNSHIFT_AFTER_END_EVENT
 * (lib/internal/streams/readable.js), an 'error' that, with no listener,
 * ends the process: one client's "P" and FIN would drop every agent's tunnels.
 */
import type { Socket } from 'node:net';

const H2_PREFACE = Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n', 'latin1');

export type SniffResult = 'h2' | 'http1' | 'closed' | 'timeout';

/**
 * Resolves once the first bytes decide the protocol, the client ends, fails
 * or closes, or `timeoutMs` passes. Never rejects. On 'h2' and 'http1' the
 * socket is paused with the bytes read so far put back; otherwise the
 * caller should destroy it.
 */
export function sniffProtocol(socket: Socket, timeoutMs: number): Promise<SniffResult> {
  return new Promise<SniffResult>((resolve) => {
    let seen: Buffer = Buffer.alloc(0);
    const finish = (result: SniffResult): void => {
      clearTimeout(timer);
      socket.off('data', onData);
      socket.off('end', onGone);
      socket.off('close', onGone);
      socket.off('error', onGone);
      socket.pause();
      // Until its next owner listens (in a promise callback), an error must not throw.
      socket.on('error', () => undefined);
      const decided = result === 'h2' || result === 'http1';
      if (decided && socket.destroyed) return resolve('closed');
      if (decided) socket.unshift(seen);
      resolve(result);
    };
    const onData = (chunk: Buffer): void => {
      seen = seen.length === 0 ? chunk : Buffer.concat([seen, chunk]);
      const n = Math.min(seen.length, H2_PREFACE.length);
      if (!seen.subarray(0, n).equals(H2_PREFACE.subarray(0, n))) finish('http1');
      else if (n === H2_PREFACE.length) finish('h2');
    };
    const onGone = (): void => finish('closed');
    const timer = setTimeout(() => finish('timeout'), timeoutMs);
    socket.on('data', onData);
    socket.once('end', onGone);
    socket.once('close', onGone);
    socket.once('error', onGone);
    if (socket.destroyed || socket.readableEnded) finish('closed');
  });
}
