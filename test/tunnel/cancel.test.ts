/**
 * Cancel, the dial path's light stand-in for AbortController: the
 * same observable behaviour as an AbortSignal for the calls the dial path
 * makes, checked side by side with the real thing.
 */
import test from 'ava';
import net from 'node:net';
import { once } from 'node:events';
import { Cancel, type CancelSignal } from '../../src/common/cancel.js';
import { dialTcp } from '../../src/tunnel/tcp-dial.js';
import { DialError } from '../../src/tunnel/errors.js';

/** The same script against Cancel and against AbortController; returns what the listeners saw. */
function script(make: () => { signal: CancelSignal; abort(): void }): string[] {
  const seen: string[] = [];
  const c = make();
  const a = (): void => void seen.push('a');
  const b = (): void => void seen.push('b');
  const removed = (): void => void seen.push('removed');
  c.signal.addEventListener('abort', a);
  c.signal.addEventListener('abort', a); // the same listener twice: called once
  c.signal.addEventListener('abort', removed);
  c.signal.removeEventListener('abort', removed);
  c.signal.removeEventListener('abort', (): void => undefined); // never added: no effect
  // One listener removes another that has not run yet: it does not run.
  const later = (): void => void seen.push('later');
  c.signal.addEventListener('abort', () => {
    seen.push('remover');
    c.signal.removeEventListener('abort', later);
  });
  c.signal.addEventListener('abort', later);
  c.signal.addEventListener('abort', b);
  seen.push(`before:${c.signal.aborted}`);
  c.abort();
  seen.push(`after:${c.signal.aborted}`);
  c.abort(); // a second abort calls nobody
  c.signal.addEventListener('abort', (): void => void seen.push('too late'));
  c.abort();
  return seen;
}

test('Cancel behaves as AbortController does for the calls the dial path makes', (t) => {
  const withCancel = script(() => {
    const c = new Cancel();
    return { signal: c, abort: () => c.abort() };
  });
  const withAbort = script(() => {
    const c = new AbortController();
    return { signal: c.signal, abort: () => c.abort() };
  });
  t.deepEqual(withCancel, ['before:false', 'a', 'remover', 'b', 'after:true']);
  t.deepEqual(withCancel, withAbort);
});

test('a listener added inside abort() is not called', (t) => {
  const c = new Cancel();
  let called = 0;
  c.addEventListener('abort', () => c.addEventListener('abort', () => called++));
  c.abort();
  t.is(called, 0);
  t.true(c.aborted);
});

test('dialTcp: a Cancel aborts a pending dial, and an aborted one refuses to start', async (t) => {
  const server = net.createServer((s) => s.destroy()).listen(0, '127.0.0.1');
  t.teardown(() => server.close());
  await once(server, 'listening');
  const address = `127.0.0.1:${(server.address() as net.AddressInfo).port}`;
  // Aborted in the same turn as the dial starts: before the connect can complete.
  const pending = new Cancel();
  const dialing = dialTcp(address, { timeoutMs: 10_000, signal: pending });
  pending.abort();
  t.is((await t.throwsAsync(dialing, { instanceOf: DialError }))?.failure, 'cancelled');

  const before = new Cancel();
  before.abort();
  t.is((await t.throwsAsync(dialTcp(address, { timeoutMs: 10_000, signal: before }), { instanceOf: DialError }))?.failure, 'cancelled');
});
