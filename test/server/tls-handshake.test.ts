/**
 * The server's TLS listeners (agent port, frontend TCP port) close a
 * connection whose handshake does not finish in time. Node only emits an
 * error at `handshakeTimeout`; without the listener closing the socket, a
 * client that sent half a TLS record, or nothing, kept its connection.
 * Listeners run in-process with a short handshake timeout; the gRPC server
 * behind them is a stub, since no connection here gets that far.
 */
import test, { type ExecutionContext } from 'ava';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import { listenForAgents, listenForFrontends, type Listener, type TlsFiles } from '../../src/server/listeners.js';
import { HttpConnectFrontend } from '../../src/server/frontends/http-connect-frontend.js';
import { KasOnlyClients } from '../../src/server/clients/kas-only-clients.js';
import { BackendDialer } from '../../src/server/frontends/backend-dialer.js';
import { AgentRegistry } from '../../src/server/agents/agent-registry.js';
import { Refusals } from '../../src/domain/refusal-log.js';
import { KanalMetrics } from '../../src/domain/metrics.js';
import type { GrpcServerTransport } from '../../src/transport/transport.js';
import { throwawayTls } from '../helpers/grpc-js-peer.js';
import { captureLogger, type CapturedLogger } from '../helpers/in-process.js';

const HANDSHAKE_TIMEOUT_MS = 300;

async function serverTls(): Promise<TlsFiles> {
  const { serverCert, serverKey, ca } = await throwawayTls();
  return { cert: serverCert, key: serverKey, ca };
}

function unusedGrpc<C>(): GrpcServerTransport<C> {
  return {
    injectConnection: (connection: Duplex) => connection.destroy(),
    close: () => Promise.resolve(),
  };
}

/** Connects, sends `bytes`, and resolves with how long the server took to close (or null after `waitMs`). */
function closedAfter(port: number, bytes: Buffer, waitMs: number): Promise<number | null> {
  return new Promise((resolve) => {
    const start = Date.now();
    const s = net.connect({ host: '127.0.0.1', port }, () => {
      if (bytes.length > 0) s.write(bytes);
    });
    s.on('error', () => undefined);
    s.resume();
    const timer = setTimeout(() => {
      s.destroy();
      resolve(null);
    }, waitMs);
    s.once('close', () => {
      clearTimeout(timer);
      resolve(Date.now() - start);
    });
  });
}

/** A TLS record header announcing 4 KiB of handshake, and only 100 bytes of it. */
const HALF_A_RECORD = Buffer.concat([Buffer.from([0x16, 0x03, 0x01, 0x10, 0x00]), Buffer.alloc(100, 0x42)]);

async function checkHandshakeTimeouts(
  t: ExecutionContext,
  listener: Listener,
  logs: CapturedLogger,
  refusals: Refusals,
  metrics: KanalMetrics,
  what: string,
): Promise<void> {
  t.teardown(() => listener.close());
  for (const [name, bytes] of [
    ['half a TLS record', HALF_A_RECORD],
    ['nothing at all', Buffer.alloc(0)],
  ] as const) {
    const ms = await closedAfter(listener.port, bytes, 5_000);
    t.not(ms, null, `${what}: a client that sent ${name} still had its connection 5 s later`);
    t.true(
      ms !== null && ms >= HANDSHAKE_TIMEOUT_MS - 50,
      `${what}: ${name} was closed after ${String(ms)} ms, before the handshake timeout`,
    );
  }
  // Both counted; the second, from the same peer for the same reason, only as a number once the window ends.
  refusals.flush();
  const lines = logs.matching(`refused ${what} connection: TLS handshake failed`);
  t.deepEqual(
    lines.map((l) => [l.err, l.suppressed]),
    [
      ['ERR_TLS_HANDSHAKE_TIMEOUT', undefined],
      ['ERR_TLS_HANDSHAKE_TIMEOUT', 1],
    ],
  );
  t.regex(String(lines[0]?.peer), /^127\.0\.0\.1:\d+$/, 'the peer is named');
  const counted = (await metrics.refusals.get()).values.find((v) => v.labels.reason === `${what}_tls_handshake`);
  t.is(counted?.value, 2);
}

function refusalsFor(logs: CapturedLogger): { refusals: Refusals; metrics: KanalMetrics } {
  const metrics = new KanalMetrics('server');
  return { refusals: new Refusals(logs.log, metrics), metrics };
}

test('agent port: a connection whose TLS handshake stalls is closed at the handshake timeout, logged and counted', async (t) => {
  const logs = captureLogger();
  const { refusals, metrics } = refusalsFor(logs);
  const listener = await listenForAgents({
    host: '127.0.0.1',
    port: 0,
    tls: await serverTls(),
    allowUnauthenticated: false,
    grpc: unusedGrpc(),
    log: logs.log,
    refusals,
    handshakeTimeoutMs: HANDSHAKE_TIMEOUT_MS,
  });
  await checkHandshakeTimeouts(t, listener, logs, refusals, metrics, 'agent');
});

test('frontend TCP port: a connection whose TLS handshake stalls is closed at the handshake timeout, logged and counted', async (t) => {
  const logs = captureLogger();
  const { refusals, metrics } = refusalsFor(logs);
  const httpConnect = new HttpConnectFrontend(
    new KasOnlyClients(new BackendDialer({ registry: new AgentRegistry(), timeoutMs: 1000, log: logs.log })),
    refusals,
  );
  const listener = await listenForFrontends({
    mode: 'both',
    tcp: { host: '127.0.0.1', port: 0, tls: await serverTls(), handshakeTimeoutMs: HANDSHAKE_TIMEOUT_MS },
    services: { grpc: unusedGrpc(), tenantFrontend: () => httpConnect, log: logs.log },
    log: logs.log,
    refusals,
  });
  await checkHandshakeTimeouts(t, listener, logs, refusals, metrics, 'frontend');
});
