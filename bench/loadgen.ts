/**
 * Bench worker: load generator (client role) or backend (server role),
 * started by the driver as a separate process so the driver never
 * bottlenecks the traffic. Writes are large and back-pressure aware; every
 * flow is bounded in bytes, and the driver bounds it in time.
 */
import net from 'node:net';
import tls from 'node:tls';
import http from 'node:http';
import https from 'node:https';
import type { Duplex } from 'node:stream';
import { ConnectRefused } from '../kit/demo/proxy-client.js';
import { socks5Connect } from './socks5-client.js';
import { serveCommands } from './rpc.js';
import {
  BULK_HEADER_BYTES,
  BULK_MODE,
  CHURN_MIX,
  HANDSHAKE_MIX,
  type BackendPorts,
  type ChurnKind,
  type ClientConfig,
  type Counters,
  type FlowMode,
  type HandshakeKind,
  type HandshakeTarget,
  type LoadgenCommands,
  type Outcomes,
  type Path,
  type Service,
  productOf,
} from './loadgen-protocol.js';
import { errorMessage } from '../src/common/error-message.js';

const counters: Counters = { rx: 0, tx: 0, t: 0, lastRxAt: 0, open: 0 };
let chunk = Buffer.alloc(256 * 1024, 0x6b);

/** Every socket this worker has open (counters.open is its size). */
const openSockets = new Set<Duplex>();

function track(sock: Duplex): void {
  counters.open++;
  openSockets.add(sock);
  sock.on('error', () => undefined);
  sock.once('close', () => {
    counters.open--;
    openSockets.delete(sock);
  });
}

function sink(sock: Duplex): void {
  sock.on('data', (c: Buffer) => {
    counters.rx += c.length;
    counters.lastRxAt = performance.now();
  });
  sock.resume();
}

/** Writes `limit` bytes in large chunks, waiting for 'drain' whenever the socket is full, then ends. */
function source(sock: Duplex, limit: number): void {
  let sent = 0;
  const go = (): void => {
    while (!sock.destroyed && sent < limit) {
      const n = Math.min(chunk.length, limit - sent);
      sent += n;
      counters.tx += n;
      if (!sock.write(n === chunk.length ? chunk : chunk.subarray(0, n))) {
        sock.once('drain', go);
        return;
      }
    }
    if (!sock.destroyed && sent >= limit) sock.end();
  };
  go();
}

// ---------------------------------------------------------------- backend role

const stalled = new Set<Duplex>();

function onBulk(sock: Duplex): void {
  track(sock);
  let head: Buffer = Buffer.alloc(0);
  const onHead = (c: Buffer): void => {
    head = head.length === 0 ? c : Buffer.concat([head, c]);
    if (head.length < BULK_HEADER_BYTES) return;
    sock.off('data', onHead);
    const mode = head[0];
    const limit = Number(head.readBigUInt64BE(1));
    const rest = head.subarray(BULK_HEADER_BYTES);
    if (mode === BULK_MODE.sink) {
      counters.rx += rest.length;
      sink(sock);
    } else if (mode === BULK_MODE.source) {
      sock.on('data', () => undefined); // ignore anything the client sends
      source(sock, limit);
    } else {
      sock.pause(); // stalled reader: never reads again
      stalled.add(sock);
      sock.once('close', () => stalled.delete(sock));
    }
  };
  sock.on('data', onHead);
}

function onEcho(sock: Duplex): void {
  track(sock);
  sock.on('data', (c: Buffer) => sock.write(c));
}

function listen(server: net.Server, host: string): Promise<number> {
  return new Promise<number>((resolve, reject) => {
    server.once('error', reject);
    server.listen({ port: 0, host, backlog: 4096 }, () => resolve((server.address() as net.AddressInfo).port));
  });
}

async function serve(args: { host: string; certPem: string; keyPem: string; chunkBytes: number }): Promise<BackendPorts> {
  chunk = Buffer.alloc(args.chunkBytes, 0x6b);
  const tlsOpts = { cert: args.certPem, key: args.keyPem };
  const bulkTcp = net.createServer({ allowHalfOpen: false, noDelay: true }, onBulk);
  const bulkTls = tls.createServer(tlsOpts, onBulk);
  const echoTcp = net.createServer({ noDelay: true }, onEcho);
  const echoTls = tls.createServer(tlsOpts, onEcho);
  const answer = (_req: http.IncomingMessage, res: http.ServerResponse): void => {
    res.writeHead(200, { 'content-type': 'text/plain', 'content-length': '3' }).end('ok\n');
  };
  const httpTcp = http.createServer({ keepAlive: false }, answer);
  const httpTls = https.createServer({ ...tlsOpts, keepAlive: false }, answer);
  for (const s of [bulkTls, echoTls, httpTls]) s.on('tlsClientError', () => undefined);
  const [a, b, c, d, e, f] = await Promise.all([bulkTcp, bulkTls, echoTcp, echoTls, httpTcp, httpTls].map((s) => listen(s, args.host)));
  return { bulkTcp: a, bulkTls: b, echoTcp: c, echoTls: d, httpTcp: e, httpTls: f };
}

// ----------------------------------------------------------------- client role

let config: ClientConfig | undefined;
const groups = new Map<string, Duplex[]>();
let held: Duplex[] = [];

function cfg(): ClientConfig {
  if (!config) throw new Error('client not configured');
  return config;
}

function once<T>(emitter: Duplex, ok: string, timeoutMs: number, what: string, value: () => T): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => done(new Error(`${what}: timed out after ${timeoutMs} ms`)), timeoutMs);
    const onOk = (): void => done(null);
    const onErr = (err: Error): void => done(err);
    const onClose = (): void => done(new Error(`${what}: closed early`));
    const done = (err: Error | null): void => {
      clearTimeout(timer);
      emitter.off(ok, onOk);
      emitter.off('error', onErr);
      emitter.off('close', onClose);
      if (err) {
        emitter.destroy();
        reject(err);
      } else resolve(value());
    };
    emitter.once(ok, onOk);
    emitter.once('error', onErr);
    emitter.once('close', onClose);
  });
}

/** CONNECT handshake; leaves the socket paused with any early tunnel bytes unshifted. */
function httpConnect(sock: net.Socket, authority: string, timeoutMs: number): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    let head: Buffer = Buffer.alloc(0);
    const timer = setTimeout(() => fail(new Error('CONNECT timed out')), timeoutMs);
    const cleanup = (): void => {
      clearTimeout(timer);
      sock.off('data', onData);
      sock.off('error', fail);
      sock.off('close', onClose);
    };
    const fail = (err: Error): void => {
      cleanup();
      sock.destroy();
      reject(err);
    };
    const onClose = (): void => fail(new Error(`CONNECT ${authority}: closed before an answer`));
    const onData = (c: Buffer): void => {
      head = head.length === 0 ? c : Buffer.concat([head, c]);
      const end = head.indexOf('\r\n\r\n');
      if (end < 0) {
        if (head.length > 16_384) fail(new Error('CONNECT answer too long'));
        return;
      }
      cleanup();
      sock.pause();
      const statusLine = head.subarray(0, head.indexOf('\r\n')).toString('latin1');
      if (statusLine.split(' ')[1] !== '200') {
        sock.destroy();
        reject(
          new ConnectRefused(
            Number(statusLine.split(' ')[1]),
            `CONNECT ${authority}: ${statusLine} ${head
              .subarray(end + 4)
              .toString('utf8')
              .trim()}`,
          ),
        );
        return;
      }
      const rest = head.subarray(end + 4);
      if (rest.length > 0) sock.unshift(rest);
      resolve();
    };
    sock.on('data', onData);
    sock.once('error', fail);
    sock.once('close', onClose);
    sock.write(`CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n\r\n`);
  });
}

const TLS_PORT: Record<Service, keyof BackendPorts> = { bulk: 'bulkTls', echo: 'echoTls', http: 'httpTls' };
const TCP_PORT: Record<Service, keyof BackendPorts> = { bulk: 'bulkTcp', echo: 'echoTcp', http: 'httpTcp' };
const OPEN_TIMEOUT_MS = 15_000;

/** Opens a connection to `service` along `path`; resolves once bytes can flow (paused for CONNECT). */
async function open(path: Path, service: Service, timeoutMs = OPEN_TIMEOUT_MS, uds?: string): Promise<Duplex> {
  const c = cfg();
  switch (path) {
    case 'direct-tcp': {
      const s = net.connect({ host: c.backendHost, port: c.backend[TCP_PORT[service]], noDelay: true });
      return once(s, 'connect', timeoutMs, 'tcp connect', () => s);
    }
    case 'direct-tls': {
      const s = tls.connect({ host: c.backendHost, port: c.backend[TLS_PORT[service]], ca: c.caPem, servername: 'localhost' });
      return once(s, 'secureConnect', timeoutMs, 'tls connect', () => s);
    }
    case 'kanal-node': {
      const s = net.connect({ host: c.nodeHost, port: c.node[service], noDelay: true });
      return once(s, 'connect', timeoutMs, 'node listener connect', () => s);
    }
    case 'kanal-socks5': {
      const socks = c.socks5;
      if (!socks) throw new Error('kanal-socks5: no SOCKS5 door configured');
      const a = socks.address;
      const s = 'uds' in a ? net.connect({ path: a.uds }) : net.connect({ host: a.host, port: a.port, noDelay: true });
      await once(s, 'connect', timeoutMs, 'socks5 connect', () => s);
      return socks5Connect(s, c.backendHost, c.backend[TCP_PORT[service]], socks, timeoutMs);
    }
    case 'kanal-cp':
    case 'kanal-cp-tls':
    case 'upstream-cp':
    case 'upstream-cp-tls': {
      const plain = !path.endsWith('-tls');
      const port = plain ? c.backend[TCP_PORT[service]] : c.backend[TLS_PORT[service]];
      const s = await connectThrough(path, `${c.backendHost}:${port}`, timeoutMs, uds);
      if (plain) return s;
      const t = tls.connect({ socket: s, ca: c.caPem, servername: 'localhost' });
      return once(t, 'secureConnect', timeoutMs, 'tls through the tunnel', () => t);
    }
  }
}

/**
 * CONNECT `authority` over the server's Unix socket of `path`'s product (or `over`, a tenant's own);
 * paused, as httpConnect leaves it.
 */
async function connectThrough(path: Path, authority: string, timeoutMs: number, over?: string): Promise<net.Socket> {
  const product = productOf(path);
  const uds = over ?? (product && cfg().uds[product]);
  if (!uds) throw new Error(`${path}: no ${product ?? 'proxy'} server configured`);
  const s = net.connect({ path: uds });
  await once(s, 'connect', timeoutMs, 'uds connect', () => s);
  await httpConnect(s, authority, timeoutMs);
  return s;
}

function header(mode: number, limit: number): Buffer {
  const h = Buffer.alloc(BULK_HEADER_BYTES);
  h[0] = mode;
  h.writeBigUInt64BE(BigInt(limit), 1);
  return h;
}

async function openFlow(path: Path, mode: FlowMode, limit: number, timeoutMs?: number): Promise<Duplex> {
  const s = await open(path, 'bulk', timeoutMs);
  track(s);
  switch (mode) {
    case 'up':
      s.write(header(BULK_MODE.sink, 0));
      s.on('data', () => undefined);
      s.resume();
      source(s, limit);
      break;
    case 'down':
      s.write(header(BULK_MODE.source, limit));
      sink(s);
      break;
    case 'stall-client':
      s.write(header(BULK_MODE.source, limit));
      s.pause(); // never reads: the backend's bytes pile up in the tunnel
      break;
    case 'stall-backend':
      s.write(header(BULK_MODE.stall, 0));
      s.on('data', () => undefined);
      s.resume();
      source(s, limit);
      break;
  }
  return s;
}

/** Runs `task` n times with at most `concurrency` at once. */
async function pool(n: number, concurrency: number, task: (i: number) => Promise<void>): Promise<void> {
  let next = 0;
  const lanes = Array.from({ length: Math.min(n, concurrency) }, async () => {
    while (next < n) await task(next++);
  });
  await Promise.all(lanes);
}

/** Writes one byte on an open echo connection and waits for it to come back. */
function echoOneByte(s: Duplex): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => done(new Error(`no echo within ${OPEN_TIMEOUT_MS} ms`)), OPEN_TIMEOUT_MS);
    const onData = (): void => done(null);
    const onClose = (): void => done(new Error('closed before the echo'));
    const done = (err: Error | null): void => {
      clearTimeout(timer);
      s.off('data', onData);
      s.off('close', onClose);
      if (err) reject(err);
      else resolve();
    };
    s.on('data', onData);
    s.on('close', onClose);
    s.resume();
    s.write('x');
  });
}

/** Time from starting to open a connection to its first byte echoed by the backend. */
async function dialOnce(path: Path, uds?: string): Promise<number> {
  const t0 = performance.now();
  const s = await open(path, 'echo', OPEN_TIMEOUT_MS, uds);
  try {
    await echoOneByte(s);
    return performance.now() - t0;
  } finally {
    s.destroy();
  }
}

/** One HTTP/1.1 GET on a new connection with Connection: close. */
async function requestOnce(path: Path): Promise<void> {
  const c = cfg();
  const s = await open(path, 'http');
  try {
    const raw = await new Promise<Buffer>((resolve, reject) => {
      const parts: Buffer[] = [];
      const timer = setTimeout(() => reject(new Error('no answer within 15 s')), OPEN_TIMEOUT_MS);
      const finish = (): void => {
        clearTimeout(timer);
        resolve(Buffer.concat(parts));
      };
      s.on('data', (d: Buffer) => parts.push(d));
      s.once('end', finish);
      s.once('close', finish);
      s.once('error', (err: Error) => {
        clearTimeout(timer);
        reject(err);
      });
      s.resume();
      s.write(`GET /healthz HTTP/1.1\r\nHost: ${c.backendHost}\r\nConnection: close\r\n\r\n`);
    });
    if (!raw.subarray(0, 15).toString('latin1').startsWith('HTTP/1.1 200')) {
      throw new Error(`unexpected answer: ${JSON.stringify(raw.subarray(0, 60).toString('latin1'))}`);
    }
  } finally {
    s.destroy();
  }
}

// ------------------------------------------------------------ churn soak

/** The first half of the HTTP/2 client preface: a client that stops mid-handshake. */
const HALF_PREFACE = 'PRI * HTTP/2.0\r\n';

/**
 * One connection of `kind` to a server's agent port, resolved with how it
 * ended (never rejected: every end is an outcome). TLS kinds write half the
 * HTTP/2 preface once the handshake is done and close after `holdMs` unless
 * the server closes first ("closed by server": what a refusal looks like
 * once TLS 1.3 has finished on the client's side).
 */
function handshakeOnce(t: HandshakeTarget, kind: HandshakeKind, holdMs: number): Promise<string> {
  return new Promise<string>((resolve) => {
    const credentials =
      kind === 'mtls' ? { cert: t.agentCertPem, key: t.agentKeyPem } : kind === 'rogue' ? { cert: t.rogueCertPem, key: t.rogueKeyPem } : {};
    const s =
      kind === 'tcp'
        ? net.connect({ host: t.host, port: t.port })
        : tls.connect({ host: t.host, port: t.port, ca: t.caPem, servername: 'localhost', ALPNProtocols: ['h2'], ...credentials });
    let stage: 'connecting' | 'open' | 'held' = 'connecting';
    // Bounds a server that neither answers nor closes.
    let timer = setTimeout(() => s.destroy(), OPEN_TIMEOUT_MS);
    const opened = (): void => {
      stage = 'open';
      clearTimeout(timer);
      if (kind === 'tcp') {
        stage = 'held';
        s.destroy();
        return;
      }
      s.write(HALF_PREFACE);
      timer = setTimeout(() => {
        stage = 'held';
        s.destroy();
      }, holdMs);
    };
    s.once(kind === 'tcp' ? 'connect' : 'secureConnect', opened);
    s.on('error', () => undefined);
    s.on('data', () => undefined);
    s.once('close', () => {
      clearTimeout(timer);
      resolve(
        `${kind} ${stage === 'held' ? (kind === 'tcp' ? 'closed' : 'held') : stage === 'open' ? 'closed by server' : 'refused in handshake'}`,
      );
    });
  });
}

/** One short tunnelled connection of `kind`; resolves with its outcome, rejects on an unexpected one. */
async function churnOnce(path: Path, kind: ChurnKind, refusedPort: number): Promise<string> {
  switch (kind) {
    case 'request':
      await requestOnce(path);
      return 'request answered';
    case 'half':
      (await open(path, 'http')).destroy();
      return 'closed after 200';
    case 'refused':
      try {
        (await connectThrough(path, `${cfg().backendHost}:${refusedPort}`, OPEN_TIMEOUT_MS)).destroy();
      } catch (err) {
        if (err instanceof ConnectRefused) return `refused ${err.status}`;
        throw err;
      }
      throw new Error(`CONNECT to the closed port ${refusedPort} answered 200`);
  }
}

function count(outcomes: Outcomes, outcome: string): void {
  outcomes[outcome] = (outcomes[outcome] ?? 0) + 1;
}

function failures(): { errors: number; firstError?: string; note(err: unknown): void } {
  const f = {
    errors: 0,
    firstError: undefined as string | undefined,
    note(err: unknown) {
      f.errors++;
      f.firstError ??= errorMessage(err);
    },
  };
  return f;
}

/** A dial flood (startFlood .. stopFlood). */
interface Flood {
  stop: boolean;
  ok: number;
  refused: Record<string, number>;
  f: ReturnType<typeof failures>;
  t0: number;
  lanes: Promise<void>[];
}

const floods = new Map<string, Flood>();

serveCommands<LoadgenCommands>({
  serve,
  configure(args) {
    config = args;
    chunk = Buffer.alloc(args.chunkBytes, 0x6b);
    return null;
  },
  counters() {
    return { ...counters, t: performance.now() };
  },
  async openFlows({ group, path, mode, count, maxBytesPerFlow, openTimeoutMs }) {
    const results = await Promise.allSettled(Array.from({ length: count }, () => openFlow(path, mode, maxBytesPerFlow, openTimeoutMs)));
    const flows = results.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
    const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) {
      for (const s of flows) s.destroy();
      throw new Error(`${count - flows.length} of ${count} flows failed to open: ${errorMessage(failed.reason)}`);
    }
    groups.set(group, [...(groups.get(group) ?? []), ...flows]);
    return { opened: flows.length };
  },
  stopFlows({ group }) {
    for (const s of groups.get(group) ?? []) s.destroy();
    groups.delete(group);
    return null;
  },
  async dials({ path, n, concurrency, uds }) {
    const latenciesMs: number[] = [];
    const f = failures();
    const t0 = performance.now();
    await pool(n, concurrency, async () => {
      try {
        latenciesMs.push(await dialOnce(path, uds));
      } catch (err) {
        f.note(err);
      }
    });
    return { latenciesMs, elapsedMs: performance.now() - t0, errors: f.errors, firstError: f.firstError };
  },
  startFlood({ id, path, concurrency, uds }) {
    if (floods.has(id)) throw new Error(`flood ${id} is running already`);
    const flood: Flood = { stop: false, ok: 0, refused: {}, f: failures(), t0: performance.now(), lanes: [] };
    let turn = 0;
    flood.lanes = Array.from({ length: concurrency }, async () => {
      while (!flood.stop) {
        const over = uds && uds.length > 0 ? uds[turn++ % uds.length] : undefined;
        try {
          await dialOnce(path, over);
          flood.ok++;
        } catch (err) {
          if (err instanceof ConnectRefused) count(flood.refused, String(err.status));
          else flood.f.note(err);
          // A lane whose dials all fail (the proxy is gone) must not spin: yield to I/O.
          if (!(err instanceof ConnectRefused)) await new Promise((resolve) => setTimeout(resolve, 10));
        }
      }
    });
    floods.set(id, flood);
    return null;
  },
  async stopFlood({ id }) {
    const flood = floods.get(id);
    if (!flood) throw new Error(`no flood ${id}`);
    flood.stop = true;
    const elapsedMs = performance.now() - flood.t0;
    await Promise.all(flood.lanes);
    floods.delete(id);
    return { ok: flood.ok, refused: flood.refused, elapsedMs, errors: flood.f.errors, firstError: flood.f.firstError };
  },
  async requests({ path, concurrency, durationMs, maxRequests }) {
    const f = failures();
    let completed = 0;
    let started = 0;
    const t0 = performance.now();
    const deadline = t0 + durationMs;
    await Promise.all(
      Array.from({ length: concurrency }, async () => {
        while (performance.now() < deadline && started < maxRequests && f.errors < 50) {
          started++;
          try {
            await requestOnce(path);
            completed++;
          } catch (err) {
            f.note(err);
          }
        }
      }),
    );
    return { completed, elapsedMs: performance.now() - t0, errors: f.errors, firstError: f.firstError };
  },
  async hold({ path, n, concurrency }) {
    const f = failures();
    await pool(n, concurrency, async () => {
      try {
        const s = await open(path, 'echo');
        track(s);
        await echoOneByte(s).catch((err: unknown) => {
          s.destroy();
          throw err;
        }); // the connection is established end to end
        s.on('data', () => undefined);
        held.push(s);
      } catch (err) {
        f.note(err);
      }
    });
    return { held: held.length, errors: f.errors, firstError: f.firstError };
  },
  async handshakes({ target, from, n, concurrency, holdMs }) {
    const outcomes: Outcomes = {};
    const t0 = performance.now();
    await pool(n, concurrency, async (i) =>
      count(outcomes, await handshakeOnce(target, HANDSHAKE_MIX[(from + i) % HANDSHAKE_MIX.length], holdMs)),
    );
    return { outcomes, elapsedMs: performance.now() - t0, errors: 0 };
  },
  async churn({ path, from, n, concurrency, refusedPort }) {
    const outcomes: Outcomes = {};
    const f = failures();
    const t0 = performance.now();
    await pool(n, concurrency, async (i) => {
      try {
        count(outcomes, await churnOnce(path, CHURN_MIX[(from + i) % CHURN_MIX.length], refusedPort));
      } catch (err) {
        f.note(err);
      }
    });
    return { outcomes, elapsedMs: performance.now() - t0, errors: f.errors, firstError: f.firstError };
  },
  release() {
    for (const s of held) s.destroy();
    held = [];
    return null;
  },
  unstall() {
    const destroyed = stalled.size;
    for (const s of stalled) s.destroy();
    stalled.clear();
    return { destroyed };
  },
  closeAll() {
    const destroyed = openSockets.size;
    for (const s of openSockets) s.destroy();
    return { destroyed };
  },
});
