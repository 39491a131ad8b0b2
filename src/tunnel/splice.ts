/**
 * Joins two byte streams (a local socket and a tunnelled connection, or two
 * tunnelled connections) in both directions. pipe() carries back-pressure
 * and turns one side's end into the other's end (half-close); the rest here
 * makes sure an error or close on either side releases both. Bytes coming
 * out of a tunnelled connection skip pipe() (see deliverTo): that is the
 * bulk receive path.
 */
import type { Duplex } from 'node:stream';
import { TunnelConnection } from './connection.js';

/** How long a side may make no progress flushing after its partner is gone. */
const FLUSH_IDLE_MS = 10_000;

export function splice(a: Duplex, b: Duplex): void {
  forward(a, b);
  forward(b, a);
  const failures = new Map<Duplex, Error>();
  a.on('error', (err: Error) => failures.set(a, err));
  b.on('error', (err: Error) => failures.set(b, err));
  const follow = (gone: Duplex, other: Duplex): void => {
    // 'close' comes once: on() spares the once() wrapper (≈ 120 B per listener, per connection).
    gone.on('close', () => {
      if (other.destroyed) return;
      const err = failures.get(gone);
      if (err || !gone.readableEnded) {
        // Abrupt: the partner cannot be finished cleanly.
        other.destroy(err);
        return;
      }
      // Clean: let what is queued flush, however slowly (#12), then release the partner.
      if (other.writableFinished) {
        other.destroy();
        return;
      }
      let left = other.writableLength;
      const timer = setInterval(() => {
        if (other.writableLength < left) left = other.writableLength;
        else other.destroy(); // stalled, not slow
      }, FLUSH_IDLE_MS);
      timer.unref();
      other.once('finish', () => other.destroy());
      other.once('close', () => clearInterval(timer));
      other.end();
    });
  };
  follow(a, b);
  follow(b, a);
}

function forward(from: Duplex, to: Duplex): void {
  if (from instanceof TunnelConnection) from.deliverTo(to);
  else from.pipe(to);
}
