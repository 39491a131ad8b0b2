/**
 * Tunnel's state (TunnelState in src/tunnel/tunnel.ts) as its callers read
 * it: open, the peer draining, writes blocked and released, closing locally
 * and closing by the stream, and what is refused once closed.
 */
import test from 'ava';
import { Tunnel } from '../../src/tunnel/tunnel.js';
import { DialError, TunnelClosedError } from '../../src/tunnel/errors.js';
import { GrpcStatus, GrpcStatusError } from '../../src/transport/grpc-status.js';
import { NO_FEATURES } from '../../src/wire/features.js';
import { captureLogger, createMemoryLink, tunnelPair, waitFor } from '../helpers/memory-stream.js';

/** What routing and the data path read. */
function views(t: Tunnel): Record<string, boolean> {
  return {
    isOpen: t.isOpen,
    closed: t.closed,
    writable: t.writable,
    drainRequested: t.drainRequested,
    preferredForDials: t.preferredForDials,
  };
}

test('open, then the peer drains: still open and writable, no longer preferred for dials; DRAIN again changes nothing', async (t) => {
  const pair = tunnelPair({ features: NO_FEATURES });
  t.teardown(() => pair.close());
  t.deepEqual(views(pair.server), { isOpen: true, closed: false, writable: true, drainRequested: false, preferredForDials: true });
  let events = 0;
  pair.server.on('drain-requested', () => events++);
  pair.agent.sendDrain();
  await waitFor(() => pair.server.drainRequested, 'DRAIN seen');
  t.deepEqual(views(pair.server), { isOpen: true, closed: false, writable: true, drainRequested: true, preferredForDials: false });
  pair.agent.sendDrain();
  await new Promise((resolve) => setTimeout(resolve, 20));
  t.is(events, 1);
  t.deepEqual(
    views(pair.agent),
    { isOpen: true, closed: false, writable: true, drainRequested: false, preferredForDials: true },
    'the side that sent DRAIN is unchanged',
  );
});

test('a tunnel whose stream is not read is open but not preferred for dials', (t) => {
  const pair = tunnelPair({ features: NO_FEATURES });
  t.teardown(() => pair.close());
  pair.server.holdInbound(7, true);
  t.true(pair.server.readPaused);
  t.deepEqual(views(pair.server), { isOpen: true, closed: false, writable: true, drainRequested: false, preferredForDials: false });
  pair.server.holdInbound(7, false);
  t.true(pair.server.preferredForDials);
});

test('writable is false while the transport refuses more and true again at its drain, which wakes the waiters once', async (t) => {
  const pair = tunnelPair({ features: NO_FEATURES, link: { sendBufferBytes: 1024 } });
  t.teardown(() => pair.close());
  pair.agent.sendData(1, Buffer.alloc(4096));
  t.false(pair.agent.writable);
  t.true(pair.agent.isOpen);
  let woken = 0;
  pair.agent.whenWritable(() => woken++);
  await waitFor(() => pair.agent.writable, 'writable again');
  t.is(woken, 1);
  t.true(pair.agent.preferredForDials, 'a blocked write says nothing of dials');
});

test('close(): closed for every view, one close event with a local error, dials refused, waiters dropped', async (t) => {
  const pair = tunnelPair({ features: NO_FEATURES });
  t.teardown(() => pair.close());
  pair.agent.sendDrain();
  await waitFor(() => pair.server.drainRequested, 'DRAIN seen');
  const errors: (Error | undefined)[] = [];
  pair.server.on('close', (err) => errors.push(err));
  pair.server.close();
  pair.server.close();
  t.deepEqual(views(pair.server), { isOpen: false, closed: true, writable: false, drainRequested: false, preferredForDials: false });
  t.is(errors.length, 1);
  t.true(errors[0] instanceof TunnelClosedError);
  const err = await t.throwsAsync(pair.server.dial('127.0.0.1:1', { timeoutMs: 1000 }));
  t.true(err instanceof DialError && err.failure === 'tunnel-closed');
  let woken = 0;
  pair.server.whenWritable(() => woken++);
  await waitFor(() => pair.agent.closed, 'the peer sees the end');
  t.is(woken, 0);
});

test("closing with a protocol-violation status is ours, not the peer's fault; the same status from the stream is", (t) => {
  const status = (): GrpcStatusError => new GrpcStatusError(GrpcStatus.RESOURCE_EXHAUSTED, 'peer does not read its stream');
  const ours = tunnelPair({ features: NO_FEATURES });
  t.teardown(() => ours.close());
  ours.server.close(status());
  t.true(ours.server.closed);
  t.is(ours.serverLog.matching('peer violated the protocol').length, 0);

  // The stream itself ending with that status (the peer sent too much, say): the peer is blamed.
  const link = createMemoryLink();
  const logs = captureLogger('debug');
  const tunnel = new Tunnel(link.b, { side: 'server', features: NO_FEATURES, log: logs.log });
  t.teardown(() => tunnel.close());
  link.b.destroy(status());
  t.true(tunnel.closed);
  t.is(logs.matching('peer violated the protocol').length, 1);
});
