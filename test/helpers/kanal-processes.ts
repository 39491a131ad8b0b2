/**
 * End-to-end fixtures: the real `kanal` CLI as child processes (server and
 * agents) with throwaway PKI in a temp dir, free loopback ports, readiness
 * waits, JSON log capture, and cleanup by pid. Plus small loopback backends
 * (echo, sink, source) and raw clients for the frontends.
 *
 * Every wait is bounded in time; every resource is released through a
 * {@link Scope}: an ava test context (`t.teardown`) or a {@link CleanupStack}
 * for fixtures shared by a whole file (run it in `test.after.always`).
 */
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import { setTimeout as sleep } from 'node:timers/promises';
import { issueAgentCertificate, writeThrowawayPki, type AgentCredential, type ThrowawayPki } from '../../kit/pki/throwaway-pki.js';
import { CLI, freePort, startKanal, waitReady, type Child } from '../../kit/demo/processes.js';
import { killOnExit, removeOnExit } from '../../kit/launch/exit-cleanup.js';
import { connectUnix, httpConnect } from '../../kit/demo/proxy-client.js';
import * as grpc from '@grpc/grpc-js';
import { ProxyStream } from './e2e-grpc-client.js';

export { CLI, freePort, connectUnix, httpConnect };

// ---------- cleanup ----------

/** Anything that runs cleanup functions later, in reverse order (ava's `t` is one). */
export interface Scope {
  teardown(fn: () => void | Promise<void>): void;
}

/** A Scope for fixtures shared by several tests: call run() from `test.after.always`. */
export class CleanupStack implements Scope {
  private readonly fns: (() => void | Promise<void>)[] = [];

  teardown(fn: () => void | Promise<void>): void {
    this.fns.push(fn);
  }

  async run(): Promise<void> {
    while (this.fns.length > 0) {
      const fn = this.fns.pop()!;
      try {
        await fn();
      } catch {
        // Keep cleaning up; a failed cleanup step must not leak the rest.
      }
    }
  }
}

// ---------- workspace: temp dir + PKI ----------

export interface Workspace {
  dir: string;
  pki: ThrowawayPki;
}

export async function makeWorkspace(scope: Scope, prefix = 'kanal-e2e-'): Promise<Workspace> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  removeOnExit.add(dir);
  scope.teardown(() => {
    fs.rmSync(dir, { recursive: true, force: true });
    removeOnExit.delete(dir);
  });
  const pki = await writeThrowawayPki(path.join(dir, 'pki'));
  return { dir, pki };
}

// ---------- JSON logs ----------

export interface LogLine {
  level: number;
  msg: string;
  [field: string]: unknown;
}

export const WARN = 40;

export function readLog(file: string): LogLine[] {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch {
    return [];
  }
  const out: LogLine[] = [];
  for (const line of text.split('\n')) {
    if (!line.startsWith('{')) continue;
    try {
      const parsed = JSON.parse(line) as unknown;
      if (parsed && typeof parsed === 'object' && typeof (parsed as LogLine).msg === 'string') out.push(parsed as LogLine);
    } catch {
      // a line being written right now
    }
  }
  return out;
}

/** The last lines of a log file, for failure messages. */
export function logTail(file: string, lines = 15): string {
  return fs.existsSync(file) ? fs.readFileSync(file, 'utf8').split('\n').slice(-lines).join('\n') : '(no log file)';
}

/** Polls a JSON log file until a line matches; throws with the log's tail after timeoutMs. */
export async function waitForLog(file: string, match: (l: LogLine) => boolean, timeoutMs: number, what: string): Promise<LogLine> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const found = readLog(file).find(match);
    if (found) return found;
    if (Date.now() >= deadline) {
      throw new Error(`no log line "${what}" in ${file} after ${timeoutMs} ms; tail:\n${logTail(file)}`);
    }
    await sleep(50);
  }
}

/** Polls `cond` (which may be async) every 50 ms until it holds; throws after timeoutMs naming `what`. */
export async function waitUntil(cond: () => boolean | Promise<boolean>, what: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting until ${what}`);
    await sleep(50);
  }
}

/** A warn (or worse) line whose msg contains `text`. */
export const warnLine =
  (text: string, extra: (l: LogLine) => boolean = () => true) =>
  (l: LogLine): boolean =>
    l.level >= WARN && l.msg.includes(text) && extra(l);

// ---------- kanal processes ----------

export interface KanalProcess {
  readonly name: string;
  readonly logFile: string;
  readonly child: Child;
  readonly pid: number;
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  running(): boolean;
  logLines(): LogLine[];
  waitForLog(match: (l: LogLine) => boolean, timeoutMs: number, what: string): Promise<LogLine>;
  /** SIGCONT (in case it was paused), then `signal`; SIGKILL if it does not exit within 10 s. */
  stop(signal?: NodeJS.Signals): Promise<number | null>;
  /** SIGSTOP: the process stops answering anything. */
  pause(): void;
  /** SIGCONT. */
  resume(): void;
  /** SIGKILL, and wait for the exit. */
  kill(): Promise<void>;
}

/** `kanal ...args` as a child the scope stops; its stdout (the JSON log) goes to `logFile`. */
export function spawnKanal(scope: Scope, name: string, args: string[], logFile: string, opts: { wrapper?: string[]; umask?: number } = {}): KanalProcess {
  const child = startKanal(args, logFile, opts);
  const pid = child.proc.pid;
  if (pid === undefined) throw new Error(`could not start ${name}`);
  killOnExit.add(pid);
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.proc.once('exit', (code, signal) => {
      killOnExit.delete(pid);
      resolve({ code, signal });
    }),
  );
  const running = (): boolean => child.proc.exitCode === null && child.proc.signalCode === null;
  const signal = (s: NodeJS.Signals): void => {
    if (!running()) return;
    try {
      process.kill(pid, s);
    } catch {
      // exited meanwhile
    }
  };
  const proc: KanalProcess = {
    name,
    logFile,
    child,
    pid,
    exited,
    running,
    logLines: () => readLog(logFile),
    waitForLog: (match, timeoutMs, what) => waitForLog(logFile, match, timeoutMs, `${name}: ${what}`),
    async stop(s: NodeJS.Signals = 'SIGTERM') {
      signal('SIGCONT');
      return child.stop(s);
    },
    pause: () => signal('SIGSTOP'),
    resume: () => signal('SIGCONT'),
    async kill() {
      signal('SIGKILL');
      await exited;
    },
  };
  scope.teardown(async () => {
    await proc.stop();
  });
  return proc;
}

/** Waits for a process's health URL to answer 200, failing early if it exits. */
export async function waitHealthy(proc: KanalProcess, url: string, timeoutMs: number): Promise<void> {
  try {
    await waitReady(url, timeoutMs, proc.child);
  } catch (err) {
    throw new Error(`${proc.name}: ${(err as Error).message}\n${logTail(proc.logFile)}`);
  }
}

/**
 * freePort() only finds a port that was free a moment ago; other test files
 * run at the same time. Retries `start` (with fresh ports) when the process
 * died of EADDRINUSE, a bounded number of times.
 */
export async function withPortRetry<T>(start: () => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await start();
    } catch (err) {
      if (attempt >= 3 || !/EADDRINUSE/.test((err as Error).message)) throw err;
    }
  }
}

export interface ServerSpec {
  /** Frontend: a Unix socket in the workspace (default) or mTLS TCP on 127.0.0.1. */
  frontend?: 'uds' | 'tcp';
  /** More flags, e.g. ['--backend-dial-timeout', '500ms']. */
  extraArgs?: string[];
  name?: string;
  /** Runs the server under this open-files limit (prlimit). */
  openFilesLimit?: number;
  /** The server's umask (default: the test process's). */
  umask?: number;
  /** Pass --cluster-ca-cert (default true); false for token authentication alone. */
  clusterCa?: boolean;
}

export interface KanalServerProcess extends KanalProcess {
  readonly agentPort: number;
  readonly healthPort: number;
  /** Admin port (/metrics, profiles) on 127.0.0.1; its own free port so parallel servers never share upstream's 8095. */
  readonly adminPort: number;
  /** TCP frontend port (0 with a Unix socket). */
  readonly frontendPort: number;
  /** Unix socket path ('' with a TCP frontend). */
  readonly uds: string;
  readonly args: readonly string[];
  readyzUrl(): string;
}

export async function startServer(scope: Scope, ws: Workspace, spec: ServerSpec = {}): Promise<KanalServerProcess> {
  const name = spec.name ?? 'server';
  const { pki } = ws;
  return withPortRetry(async () => {
    const [agentPort, healthPort, adminPort] = [await freePort(), await freePort(), await freePort()];
    const args = [
      'server',
      '--cluster-cert', pki.serverCert, '--cluster-key', pki.serverKey,
      ...(spec.clusterCa ?? true ? ['--cluster-ca-cert', pki.caCert] : []),
      '--agent-bind-address', '127.0.0.1', '--agent-port', String(agentPort),
      '--health-bind-address', '127.0.0.1', '--health-port', String(healthPort),
      '--admin-port', String(adminPort),
      '--server-id', name,
      '--log-level', 'debug',
    ];
    let uds = '';
    let frontendPort = 0;
    if ((spec.frontend ?? 'uds') === 'uds') {
      uds = path.join(ws.dir, `${name}.sock`);
      args.push('--uds-name', uds, '--delete-existing-uds-file');
    } else {
      frontendPort = await freePort();
      args.push(
        '--server-bind-address', '127.0.0.1', '--server-port', String(frontendPort),
        '--server-cert', pki.frontendCert, '--server-key', pki.frontendKey, '--server-ca-cert', pki.frontendCaCert,
      );
    }
    args.push(...(spec.extraArgs ?? []));
    const wrapper = spec.openFilesLimit ? ['prlimit', `--nofile=${spec.openFilesLimit}:${spec.openFilesLimit}`, '--'] : [];
    const proc = spawnKanal(scope, name, args, path.join(ws.dir, `${name}.log`), { wrapper, umask: spec.umask });
    // /healthz answers once every listener is up (the health port opens last).
    await waitHealthy(proc, `http://127.0.0.1:${healthPort}/healthz`, 20_000);
    return { ...proc, agentPort, healthPort, adminPort, frontendPort, uds, args, readyzUrl: () => `http://127.0.0.1:${healthPort}/readyz` };
  });
}

/** Starts the same server again (same flags, ports and log file) after it stopped. */
export async function restartServer(scope: Scope, old: KanalServerProcess): Promise<KanalServerProcess> {
  if (old.running()) throw new Error(`${old.name} is still running`);
  const proc = spawnKanal(scope, old.name, [...old.args], old.logFile);
  // The agent port may still be held for a moment by the old process's sockets.
  await waitHealthy(proc, `http://127.0.0.1:${old.healthPort}/healthz`, 20_000);
  return { ...old, ...proc };
}

export interface AgentSpec {
  agentID?: string;
  /**
   * Client certificate: the agent's own (default: CN = its agentID, as each
   * node holds its own), the workspace's one shared agent.crt, one from
   * another CA, or none at all.
   */
  cert?: 'good' | 'shared' | 'rogue' | 'none';
  extraArgs?: string[];
  /** Wait for the agent's /readyz (a tunnel is up). Default true. */
  waitReady?: boolean;
}

export interface KanalAgentProcess extends KanalProcess {
  readonly agentID: string;
  readonly healthPort: number;
  /** Admin port on 127.0.0.1 (its own free port, never upstream's 8094). */
  readonly adminPort: number;
  readyzUrl(): string;
}

/** `server` is any server with an agent port on 127.0.0.1 (a Kanal server, or another gRPC peer). */
export async function startAgent(scope: Scope, ws: Workspace, server: Pick<KanalServerProcess, 'agentPort'>, spec: AgentSpec = {}): Promise<KanalAgentProcess> {
  const agentID = spec.agentID ?? 'agent-1';
  const { pki } = ws;
  return withPortRetry(async () => {
    const [healthPort, adminPort] = [await freePort(), await freePort()];
    const args = [
      'agent',
      '--proxy-server-host', '127.0.0.1', '--proxy-server-port', String(server.agentPort),
      '--ca-cert', pki.caCert,
      '--agent-id', agentID,
      '--health-bind-address', '127.0.0.1', '--health-server-port', String(healthPort),
      '--admin-server-port', String(adminPort),
      '--sync-interval', '200ms', '--sync-interval-cap', '1s',
      '--shutdown-grace-period', '1s',
      '--log-level', 'debug',
    ];
    const cert = spec.cert ?? 'good';
    if (cert === 'good') {
      const own = await issueAgentCertificate(pki, agentID);
      args.push('--agent-cert', own.cert, '--agent-key', own.key);
    }
    if (cert === 'shared') args.push('--agent-cert', pki.agentCert, '--agent-key', pki.agentKey);
    if (cert === 'rogue') args.push('--agent-cert', pki.rogueAgentCert, '--agent-key', pki.rogueAgentKey);
    args.push(...(spec.extraArgs ?? []));
    const proc = spawnKanal(scope, agentID, args, path.join(ws.dir, `${agentID}.log`));
    const readyzUrl = (): string => `http://127.0.0.1:${healthPort}/readyz`;
    // Up first (health port open), then ready (a tunnel is up) if asked.
    await waitHealthy(proc, `http://127.0.0.1:${healthPort}/healthz`, 20_000);
    if (spec.waitReady ?? true) await waitHealthy(proc, readyzUrl(), 20_000);
    return { ...proc, agentID, healthPort, adminPort, readyzUrl };
  });
}

/** Server plus one connected agent, both ready. */
export async function startPair(
  scope: Scope,
  ws: Workspace,
  spec: { server?: ServerSpec; agent?: AgentSpec } = {},
): Promise<{ server: KanalServerProcess; agent: KanalAgentProcess }> {
  const server = await startServer(scope, ws, spec.server);
  const agent = await startAgent(scope, ws, server, spec.agent);
  await waitStatus(server.readyzUrl(), 200, 10_000);
  return { server, agent };
}

// ---------- HTTP probes ----------

export function httpGet(url: string, timeoutMs = 2000): Promise<{ status: number; body: string }> {
  return new Promise((resolve) => {
    const req = http.get(url, { timeout: timeoutMs }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      res.on('error', () => resolve({ status: 0, body }));
    });
    req.on('error', () => resolve({ status: 0, body: '' }));
    req.on('timeout', () => req.destroy());
  });
}

/** Polls `url` until it answers `status`; throws after timeoutMs with the last answer. */
export async function waitStatus(url: string, status: number, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last = { status: 0, body: '' };
  while (Date.now() < deadline) {
    last = await httpGet(url);
    if (last.status === status) return;
    await sleep(100);
  }
  throw new Error(`${url}: wanted ${status}, last answer ${last.status} ${last.body.trim()} after ${timeoutMs} ms`);
}

/**
 * Scrapes /metrics and returns every sample as `name{labels}` -> value
 * (labels exactly as exposed, so unlabelled gauges are just `name`).
 */
export async function scrapeMetrics(healthPort: number): Promise<Map<string, number>> {
  const res = await httpGet(`http://127.0.0.1:${healthPort}/metrics`, 5000);
  if (res.status !== 200) throw new Error(`/metrics answered ${res.status}`);
  const out = new Map<string, number>();
  for (const line of res.body.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const cut = line.lastIndexOf(' ');
    out.set(line.slice(0, cut), Number(line.slice(cut + 1)));
  }
  return out;
}

/** Polls /metrics until every named sample has the wanted value; returns the last scrape. */
export async function waitMetrics(healthPort: number, want: Record<string, number>, timeoutMs: number): Promise<Map<string, number>> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const m = await scrapeMetrics(healthPort);
    const wrong = Object.entries(want).filter(([k, v]) => m.get(k) !== v);
    if (wrong.length === 0) return m;
    if (Date.now() >= deadline) {
      throw new Error(`metrics not as wanted after ${timeoutMs} ms: ${wrong.map(([k, v]) => `${k}=${m.get(k)} (want ${v})`).join(', ')}`);
    }
    await sleep(100);
  }
}

// ---------- loopback backends ----------

export interface Backend {
  port: number;
  address: string;
  /** Sockets accepted so far. */
  accepted(): number;
  /** Sockets currently open. */
  open(): number;
}

async function listenBackend(scope: Scope, onSocket: (s: net.Socket) => void): Promise<Backend> {
  const sockets = new Set<net.Socket>();
  let accepted = 0;
  const server = net.createServer({ allowHalfOpen: true }, (s) => {
    accepted++;
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
    s.on('error', () => s.destroy());
    onSocket(s);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  scope.teardown(
    () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  );
  const port = (server.address() as net.AddressInfo).port;
  return { port, address: `127.0.0.1:${port}`, accepted: () => accepted, open: () => sockets.size };
}

/** Echoes every byte; ends its side when the client ends. */
export function startEchoBackend(scope: Scope): Promise<Backend> {
  return listenBackend(scope, (s) => s.pipe(s));
}

/** Speaks first: writes `banner` as soon as it accepts, then echoes (a server-speaks-first protocol, like SSH or SMTP). */
export function startBannerBackend(scope: Scope, banner: Buffer): Promise<Backend> {
  return listenBackend(scope, (s) => {
    s.write(banner);
    s.pipe(s);
  });
}

/**
 * Reads exactly `size` bytes, then answers with their sha256 (hex) and ends.
 * With `stallUntil`, reads nothing before that promise settles (a node-side
 * reader that is slower than the sender); with `bytesPerSecond`, reads at
 * that pace.
 */
export function startSinkBackend(scope: Scope, size: number, opts: { stallUntil?: Promise<unknown>; bytesPerSecond?: number } = {}): Promise<Backend> {
  return listenBackend(scope, (s) => {
    const hash = createHash('sha256');
    let got = 0;
    if (opts.bytesPerSecond) throttle(s, opts.bytesPerSecond);
    if (opts.stallUntil) {
      s.pause();
      const go = (): void => void (s.destroyed || s.resume());
      opts.stallUntil.then(go, go);
    }
    s.on('data', (c: Buffer) => {
      if (got >= size) return;
      const take = c.subarray(0, size - got);
      hash.update(take);
      got += take.length;
      if (got === size) s.end(hash.digest('hex'));
    });
  });
}

/**
 * Writes `payload` (with back-pressure), then ends. With `afterFirstByte` it
 * waits for the client to send a byte first (upstream's CONNECT frontend may
 * write a backend's first bytes before its 200 line when the backend speaks first).
 */
export function startSourceBackend(scope: Scope, payload: Buffer, opts: { afterFirstByte?: boolean } = {}): Promise<Backend> {
  return listenBackend(scope, (s) => {
    const send = (): void => {
      s.resume();
      writeAll(s, payload).then(
        () => s.end(),
        () => s.destroy(),
      );
    };
    if (opts.afterFirstByte) s.once('data', send);
    else send();
  });
}

/** Writes 64 KiB chunks (with back-pressure) until the connection goes away. */
export function startFirehoseBackend(scope: Scope): Promise<Backend> {
  const chunk = Buffer.alloc(64 * 1024, 'f');
  return listenBackend(scope, (s) => {
    s.resume();
    const pump = (): void => {
      while (!s.destroyed && s.writable) {
        if (!s.write(chunk)) {
          s.once('drain', pump);
          return;
        }
      }
    };
    pump();
  });
}

/** Answers one HTTP request with `body`, like any web server on a node. */
export async function startHttpBackend(scope: Scope, body: string | Buffer): Promise<Backend> {
  const server = http.createServer((req, res) => {
    res.writeHead(200, { 'content-type': 'text/plain', 'content-length': Buffer.byteLength(body), 'x-path': req.url ?? '' }).end(body);
  });
  let accepted = 0;
  let open = 0;
  server.on('connection', (s: net.Socket) => {
    accepted++;
    open++;
    s.once('close', () => open--);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
  scope.teardown(
    () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  );
  const port = (server.address() as net.AddressInfo).port;
  return { port, address: `127.0.0.1:${port}`, accepted: () => accepted, open: () => open };
}

// ---------- byte streams ----------

export function sha256(b: Uint8Array): string {
  return createHash('sha256').update(b).digest('hex');
}

/** Makes a flowing readable deliver at most `bytesPerSecond` on average (a slow reader: the kernel's buffers then fill). */
export function throttle(s: NodeJS.ReadableStream, bytesPerSecond: number): void {
  const t0 = performance.now();
  let got = 0;
  s.on('data', (c: Buffer) => {
    got += c.length;
    const ahead = (got / bytesPerSecond) * 1000 - (performance.now() - t0);
    if (ahead > 1) {
      s.pause();
      setTimeout(() => s.resume(), ahead);
    }
  });
}

/**
 * Reads exactly `n` bytes (at `bytesPerSecond` if given) and resolves with
 * their sha256; rejects if the stream ends or fails first, or after timeoutMs.
 */
export function readHashed(s: net.Socket, n: number, timeoutMs: number, bytesPerSecond?: number): Promise<string> {
  return new Promise<string>((resolve, reject) => {
    const hash = createHash('sha256');
    let got = 0;
    const timer = setTimeout(() => finish(new Error(`read ${got}/${n} bytes in ${timeoutMs} ms`)), timeoutMs);
    const finish = (err: Error | null): void => {
      clearTimeout(timer);
      s.off('end', onEnd);
      s.off('close', onEnd);
      s.off('error', finish);
      if (err) reject(err);
      else resolve(hash.digest('hex'));
    };
    const onEnd = (): void => finish(new Error(`stream ended after ${got}/${n} bytes`));
    s.on('data', (c: Buffer) => {
      if (got >= n) return;
      const take = c.subarray(0, n - got);
      hash.update(take);
      got += take.length;
      if (got === n) finish(null);
    });
    s.once('end', onEnd);
    s.once('close', onEnd);
    s.once('error', finish);
    if (bytesPerSecond) throttle(s, bytesPerSecond);
    s.resume();
  });
}

/** Writes `data` in 256 KiB chunks, honouring back-pressure. */
export async function writeAll(s: NodeJS.WritableStream & { destroyed?: boolean }, data: Buffer): Promise<void> {
  const CHUNK = 256 * 1024;
  for (let off = 0; off < data.length; off += CHUNK) {
    if (s.destroyed) throw new Error('stream destroyed while writing');
    if (!s.write(data.subarray(off, off + CHUNK))) {
      await new Promise<void>((resolve, reject) => {
        const onDrain = (): void => {
          s.off('close', onClose);
          resolve();
        };
        const onClose = (): void => {
          s.off('drain', onDrain);
          reject(new Error('stream closed while writing'));
        };
        s.once('drain', onDrain);
        s.once('close', onClose);
      });
    }
  }
}

/** Reads until `n` bytes arrived; rejects on close/error/timeout first. */
/**
 * Resolves once `s` has delivered at least `n` bytes (bounded by timeoutMs),
 * keeping none of them; it goes on reading (and discarding) afterwards, and
 * errors after that point are ignored.
 */
export function receiveAtLeast(s: net.Socket, n: number, timeoutMs: number): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    let got = 0;
    let done = false;
    const timer = setTimeout(() => {
      done = true;
      reject(new Error(`only ${got}/${n} bytes in ${timeoutMs} ms`));
    }, timeoutMs);
    s.on('data', (c: Buffer) => {
      got += c.length;
      if (!done && got >= n) {
        done = true;
        clearTimeout(timer);
        resolve();
      }
    });
    s.on('error', (err: Error) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      reject(err);
    });
    s.resume();
  });
}

export function readExactly(s: net.Socket | NodeJS.ReadableStream, n: number, timeoutMs: number): Promise<Buffer> {
  return new Promise<Buffer>((resolve, reject) => {
    const chunks: Buffer[] = [];
    let got = 0;
    const timer = setTimeout(() => finish(new Error(`read ${got}/${n} bytes in ${timeoutMs} ms`)), timeoutMs);
    const finish = (err: Error | null): void => {
      clearTimeout(timer);
      s.off('data', onData);
      s.off('end', onEnd);
      s.off('close', onEnd);
      s.off('error', onError);
      if (err) reject(err);
      else resolve(Buffer.concat(chunks));
    };
    const onData = (c: Buffer): void => {
      chunks.push(c);
      got += c.length;
      if (got >= n) {
        (s as net.Socket).pause?.();
        const all = Buffer.concat(chunks);
        // Put back what belongs to a later read.
        if (all.length > n) (s as net.Socket).unshift(all.subarray(n));
        chunks.length = 0;
        chunks.push(all.subarray(0, n));
        finish(null);
      }
    };
    const onEnd = (): void => finish(new Error(`stream ended after ${got}/${n} bytes`));
    const onError = (err: Error): void => finish(err);
    s.on('data', onData);
    s.once('end', onEnd);
    s.once('close', onEnd);
    s.once('error', onError);
    s.resume();
  });
}

/** Reads until the stream ends; rejects on error/timeout. */
export function readToEnd(s: net.Socket | NodeJS.ReadableStream, timeoutMs: number): Promise<Buffer> {
  return new Promise<Buffer>((resolve, reject) => {
    const chunks: Buffer[] = [];
    const timer = setTimeout(() => finish(new Error(`no end within ${timeoutMs} ms (${Buffer.concat(chunks).length} bytes read)`)), timeoutMs);
    const finish = (err: Error | null): void => {
      clearTimeout(timer);
      s.off('data', onData);
      s.off('end', onEnd);
      s.off('error', onError);
      if (err) reject(err);
      else resolve(Buffer.concat(chunks));
    };
    const onData = (c: Buffer): void => void chunks.push(c);
    const onEnd = (): void => finish(null);
    const onError = (err: Error): void => finish(err);
    s.on('data', onData);
    s.once('end', onEnd);
    s.once('error', onError);
    s.resume();
  });
}

/**
 * Resolves when the peer has closed the connection (EOF, reset or close),
 * discarding any data still arriving; rejects after timeoutMs. The socket is
 * destroyed either way.
 */
export function waitClosed(s: net.Socket, timeoutMs: number): Promise<void> {
  if (s.destroyed || s.readableEnded) {
    s.destroy();
    return Promise.resolve();
  }
  return new Promise<void>((resolve, reject) => {
    const done = (err: Error | null): void => {
      clearTimeout(timer);
      s.off('end', onClosed);
      s.off('close', onClosed);
      s.destroy();
      if (err) reject(err);
      else resolve();
    };
    const onClosed = (): void => done(null);
    const timer = setTimeout(() => done(new Error(`socket still open after ${timeoutMs} ms`)), timeoutMs);
    s.once('end', onClosed);
    s.once('close', onClosed);
    s.on('error', () => undefined);
    s.on('data', () => undefined);
    s.resume();
  });
}

/** Writes `data` and expects the same bytes back (through an echo backend). */
export async function echoRoundTrip(s: net.Socket, data: Buffer, timeoutMs = 10_000): Promise<boolean> {
  const reading = readExactly(s, data.length, timeoutMs);
  await writeAll(s, data);
  return (await reading).equals(data);
}

// ---------- frontend clients ----------

/** CONNECT through a server's Unix-socket frontend; resolves with the tunnelled socket. */
export async function connectThrough(server: KanalServerProcess, address: string, timeoutMs = 15_000): Promise<net.Socket> {
  const s = await connectUnix(server.uds);
  return httpConnect(s, address, timeoutMs);
}

/**
 * Opens an mTLS connection to the TCP frontend (HTTP/1.1 via ALPN) with the
 * KAS's client certificate (default), none, or another one (an agent's, to
 * check that roles never mix).
 */
export function tlsToFrontend(
  server: KanalServerProcess,
  ws: Workspace,
  opts: { clientCert?: boolean; credential?: AgentCredential } = {},
): Promise<tls.TLSSocket> {
  const { pki } = ws;
  const credential = opts.clientCert === false ? undefined : (opts.credential ?? { cert: pki.frontendClientCert, key: pki.frontendClientKey });
  return new Promise<tls.TLSSocket>((resolve, reject) => {
    const s = tls.connect({
      host: '127.0.0.1',
      port: server.frontendPort,
      ca: fs.readFileSync(pki.frontendCaCert),
      cert: credential && fs.readFileSync(credential.cert),
      key: credential && fs.readFileSync(credential.key),
      ALPNProtocols: ['http/1.1'],
    });
    s.once('secureConnect', () => resolve(s));
    s.once('error', reject);
  });
}

/** The TCP frontend over mTLS, with the TCP socket under it (to reset it: `raw.resetAndDestroy()`). */
export function tlsToFrontendRaw(server: KanalServerProcess, ws: Workspace): Promise<{ raw: net.Socket; tls: tls.TLSSocket }> {
  const { pki } = ws;
  return new Promise((resolve, reject) => {
    const raw = net.connect({ host: '127.0.0.1', port: server.frontendPort });
    raw.on('error', () => undefined);
    const s = tls.connect({
      socket: raw,
      servername: 'localhost',
      ca: fs.readFileSync(pki.frontendCaCert),
      cert: fs.readFileSync(pki.frontendClientCert),
      key: fs.readFileSync(pki.frontendClientKey),
    });
    s.once('secureConnect', () => resolve({ raw, tls: s }));
    s.once('error', reject);
  });
}

/** A gRPC ProxyService stream to a server's frontend (Unix socket, or mTLS TCP with the frontend client certificate). */
export function frontendProxyStream(server: KanalServerProcess, ws: Workspace): ProxyStream {
  if (server.uds) return new ProxyStream(`unix://${server.uds}`);
  const { pki } = ws;
  return new ProxyStream(`127.0.0.1:${server.frontendPort}`, {
    credentials: grpc.credentials.createSsl(fs.readFileSync(pki.frontendCaCert), fs.readFileSync(pki.frontendClientKey), fs.readFileSync(pki.frontendClientCert)),
    channelOptions: { 'grpc.ssl_target_name_override': 'localhost', 'grpc.default_authority': 'localhost' },
  });
}

/** Open file descriptors of a process (sockets included), from /proc. */
export function fdCount(pid: number): number {
  return fs.readdirSync(`/proc/${pid}/fd`).length;
}

export interface RawAnswer {
  status: number;
  statusLine: string;
  body: string;
  raw: string;
}

/**
 * Sends `request` as-is on a fresh Unix-socket connection and reads the
 * answer until the server closes (bounded). For refusals (4xx/5xx).
 */
export async function rawRequest(uds: string, request: string | Buffer, timeoutMs = 10_000): Promise<RawAnswer> {
  const s = await connectUnix(uds);
  s.on('error', () => undefined);
  const reading = readToEnd(s, timeoutMs);
  s.write(request);
  let buf: Buffer;
  try {
    buf = await reading;
  } finally {
    s.destroy();
  }
  const raw = buf.toString('utf8');
  const statusLine = raw.split('\r\n', 1)[0] ?? '';
  const end = raw.indexOf('\r\n\r\n');
  return { status: Number(statusLine.split(' ')[1] ?? 0), statusLine, body: end >= 0 ? raw.slice(end + 4) : '', raw };
}

/** Connects to a TCP port, writes `bytes`, and waits (bounded) for the peer to close. */
export async function sendGarbage(port: number, bytes: Buffer, timeoutMs = 10_000): Promise<Buffer> {
  const s = net.connect({ host: '127.0.0.1', port });
  s.on('error', () => undefined);
  await new Promise<void>((resolve, reject) => {
    s.once('connect', () => resolve());
    s.once('error', reject);
  });
  return sendAndCollect(s, bytes, timeoutMs);
}

/** Same as sendGarbage for a Unix socket. */
export async function sendGarbageUnix(uds: string, bytes: Buffer, timeoutMs = 10_000): Promise<Buffer> {
  const s = await connectUnix(uds);
  s.on('error', () => undefined);
  return sendAndCollect(s, bytes, timeoutMs);
}

/** Writes `bytes`, then collects whatever comes back until the peer closes (bounded). */
async function sendAndCollect(s: net.Socket, bytes: Buffer, timeoutMs: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  s.on('data', (c: Buffer) => chunks.push(c));
  s.write(bytes);
  try {
    await waitClosed(s, timeoutMs);
  } finally {
    s.destroy();
  }
  return Buffer.concat(chunks);
}

// ---------- the real CLI, one-shot ----------

export interface CliResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs `kanal ...args` to completion (bounded by timeoutMs). */
export function runCli(args: string[], timeoutMs = 20_000): Promise<CliResult> {
  return new Promise<CliResult>((resolve) => {
    execFile(process.execPath, [CLI, ...args], { timeout: timeoutMs, killSignal: 'SIGKILL' }, (err, stdout, stderr) => {
      const code = err ? (typeof err.code === 'number' ? err.code : null) : 0;
      resolve({ code, stdout, stderr });
    });
  });
}

/** Runs /usr/bin/curl with a clean proxy environment (bounded by timeoutMs). */
export function runCurl(args: string[], timeoutMs = 30_000): Promise<CliResult> {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) if (!/proxy/i.test(k)) env[k] = v;
  return new Promise<CliResult>((resolve) => {
    execFile('/usr/bin/curl', args, { timeout: timeoutMs, killSignal: 'SIGKILL', env, maxBuffer: 64 * 1024 * 1024 }, (err, stdout, stderr) => {
      const code = err ? (typeof err.code === 'number' ? err.code : null) : 0;
      resolve({ code, stdout, stderr });
    });
  });
}
