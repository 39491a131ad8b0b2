/** Dials TCP with a deadline and cancellation, as both sides perform a peer's DIAL_REQ; failures are the tunnel's DialErrors. */
import net from 'node:net';
import { DialError } from './errors.js';
import type { CancelSignal } from '../common/cancel.js';
import { parseHostPort, formatHostPort } from '../common/host-port.js';
import { errorMessage } from '../common/error-message.js';

export interface TcpDialOptions {
  timeoutMs: number;
  signal?: CancelSignal;
}

export function dialTcp(address: string, opts: TcpDialOptions): Promise<net.Socket> {
  let target;
  try {
    target = parseHostPort(address);
  } catch (err) {
    return Promise.reject(new DialError('refused', errorMessage(err)));
  }
  const label = formatHostPort(target);
  return new Promise<net.Socket>((resolve, reject) => {
    const socket = net.connect({ host: target.host, port: target.port, allowHalfOpen: true, noDelay: true });
    const done = (err: Error | null): void => {
      clearTimeout(timer);
      opts.signal?.removeEventListener('abort', onAbort);
      socket.off('error', onError);
      socket.off('connect', onConnect);
      if (err) {
        socket.destroy();
        reject(err);
      } else {
        resolve(socket);
      }
    };
    const onConnect = (): void => done(null);
    const onError = (err: NodeJS.ErrnoException): void =>
      done(new DialError('refused', `dial tcp ${label}: ${err.code ?? ''} ${err.message}`.replace(/\s+/g, ' ').trim()));
    const onAbort = (): void => done(new DialError('cancelled', `dial tcp ${label}: cancelled`));
    const timer = setTimeout(
      () => done(new DialError('timeout', `dial tcp ${label}: i/o timeout after ${opts.timeoutMs} ms`)),
      opts.timeoutMs,
    );
    socket.once('connect', onConnect);
    socket.once('error', onError);
    if (opts.signal?.aborted) onAbort();
    else opts.signal?.addEventListener('abort', onAbort);
  });
}
