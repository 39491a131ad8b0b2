/**
 * Tells an HTTP/2 connection (gRPC) from an HTTP/1.1 one (CONNECT) by its
 * first bytes, then puts the bytes back so the real parser sees them.
 */
import type { Socket } from 'node:net';

const H2_PREFACE = Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n', 'latin1');

export type SniffResult = 'h2' | 'http1' | 'closed' | 'timeout';

export function sniffProtocol(socket: Socket, timeoutMs: number): Promise<SniffResult> {
  return new Promise<SniffResult>((resolve) => {
    let seen: Buffer = Buffer.alloc(0);
    const finish = (result: SniffResult): void => {
      clearTimeout(timer);
      socket.off('data', onData);
      socket.off('close', onClose);
      socket.off('end', onClose);
      socket.pause();
      if (seen.length > 0) socket.unshift(seen);
      resolve(result);
    };
    const onData = (chunk: Buffer): void => {
      seen = seen.length === 0 ? chunk : Buffer.concat([seen, chunk]);
      const n = Math.min(seen.length, H2_PREFACE.length);
      if (!seen.subarray(0, n).equals(H2_PREFACE.subarray(0, n))) finish('http1');
      else if (n === H2_PREFACE.length) finish('h2');
    };
    const onClose = (): void => finish('closed');
    const timer = setTimeout(() => finish('timeout'), timeoutMs);
    socket.on('data', onData);
    socket.once('end', onClose);
    socket.once('close', onClose);
  });
}
