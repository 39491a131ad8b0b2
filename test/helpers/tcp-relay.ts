/**
 * A loopback TCP relay a test can break the ways a network breaks: cut()
 * resets both sides of every open pair (a middlebox that forgot the flow),
 * blackhole() stops forwarding while every socket stays open (a path that
 * drops packets silently: no FIN, no RST, only a PING notices), restore()
 * forwards again. New connections are relayed while black-holed too, and
 * swallowed the same way, as a dead route would swallow them.
 */
import net from 'node:net';
import type { Scope } from '../../kit/launch/cleanup-scope.js';

export interface TcpRelay {
  /** The relay's port on `host` (127.0.0.1 unless given). */
  readonly port: number;
  /** Resets both sides of every pair open now (RST, not FIN); later connections are relayed as before. */
  cut(): void;
  /** Stops forwarding and reading on every pair, open now or later, without closing anything. */
  blackhole(): void;
  /** Forwards again; bytes held back meanwhile (in the relay's and the kernel's buffers) go first, none is dropped. */
  restore(): void;
  /** Pairs accepted so far. */
  connections(): number;
  /** Pairs open now. */
  open(): number;
  /** Closes the listener and every pair; also run by the scope's teardown. */
  close(): Promise<void>;
}

/** One accepted connection and its connection to the target. */
interface Pair {
  client: net.Socket;
  target: net.Socket;
}

/** A relay on `host` (default 127.0.0.1) to `target`; closed with `scope`. */
export async function startTcpRelay(scope: Scope, target: { host: string; port: number }, host = '127.0.0.1'): Promise<TcpRelay> {
  const pairs = new Set<Pair>();
  let accepted = 0;
  let holding = false;

  const hold = (p: Pair): void => {
    p.client.pause();
    p.target.pause();
  };
  const server = net.createServer({ pauseOnConnect: true, allowHalfOpen: true }, (client) => {
    accepted++;
    const pair: Pair = { client, target: net.connect({ host: target.host, port: target.port, allowHalfOpen: true }) };
    pairs.add(pair);
    for (const [from, to] of [
      [pair.client, pair.target],
      [pair.target, pair.client],
    ] as const) {
      from.on('error', () => undefined);
      // By hand rather than pipe(): a pipe resumes its source on the destination's 'drain', even while held.
      from.on('data', (chunk: Buffer) => {
        if (to.destroyed || to.write(chunk)) return;
        from.pause();
        to.once('drain', () => holding || from.resume());
      });
      from.on('end', () => to.end());
      from.once('close', () => {
        pairs.delete(pair);
        to.destroy();
      });
    }
    if (holding) hold(pair);
    else client.resume();
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, host, () => resolve());
  });

  let closing: Promise<void> | undefined;
  const close = (): Promise<void> => {
    closing ??= new Promise<void>((resolve) => {
      for (const p of pairs) {
        p.client.destroy();
        p.target.destroy();
      }
      server.close(() => resolve());
    });
    return closing;
  };
  scope.teardown(close);

  return {
    port: (server.address() as net.AddressInfo).port,
    cut() {
      for (const p of [...pairs]) {
        p.client.resetAndDestroy();
        p.target.resetAndDestroy();
      }
    },
    blackhole() {
      holding = true;
      for (const p of pairs) hold(p);
    },
    restore() {
      holding = false;
      for (const p of pairs) {
        p.client.resume();
        p.target.resume();
      }
    },
    connections: () => accepted,
    open: () => pairs.size,
    close,
  };
}
