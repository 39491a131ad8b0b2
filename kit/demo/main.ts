/**
 * `npm run demo`: both directions on loopback, no root. Starts a Kanal
 * server and agent (the real CLI, throwaway certificates), a node-side HTTP
 * backend and a kube-apiserver stand-in, sends traffic through every
 * frontend and direction, prints what went through, and cleans up: at the
 * end, and on Ctrl-C or SIGTERM. `--keep` keeps it running after the steps
 * until then, for trying things by hand.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import { writeThrowawayPki, type ThrowawayPki } from '../pki/throwaway-pki.js';
import type { Child } from '../launch/child.js';
import { loadTransport } from '../../src/transport/choice.js';
import { connectUnix, httpConnect, grpcDial } from './proxy-client.js';
import { CleanupStack } from '../launch/cleanup-scope.js';
import { removeOnExit } from '../launch/exit-cleanup.js';
import { cleanUpOnSignals } from '../launch/signal-cleanup.js';
import { freePort, kanalCommand, loopbackAgentArgs, loopbackServerArgs, spawnKanal, waitHealthy } from '../launch/kanal-cli.js';
import { errorMessage } from '../../src/common/error-message.js';

const ADVERTISE = '127.0.0.2';

interface Row {
  what: string;
  result: string;
  bytes: number;
  ms: number;
}

/** Runs one step and records its row: what it got, or the error it threw. */
type Timer = (what: string, fn: () => Promise<{ result: string; bytes: number }>) => Promise<void>;

/**
 * Sends an HTTP/1.1 GET over an established stream and returns the raw
 * response, closing the stream: a connection left half open would hold the
 * agent's shutdown for its --shutdown-grace-period.
 */
function httpOver(conn: Duplex, host: string, pathName: string): Promise<Buffer> {
  return new Promise<Buffer>((resolve, reject) => {
    const chunks: Buffer[] = [];
    conn.on('data', (c: Buffer) => chunks.push(c));
    conn.once('end', () => {
      conn.destroy();
      resolve(Buffer.concat(chunks));
    });
    conn.once('error', reject);
    conn.write(`GET ${pathName} HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`);
    conn.resume();
  });
}

function statusOf(raw: Buffer): string {
  return raw.subarray(0, raw.indexOf('\r\n')).toString('latin1');
}

/** Ports and paths the demo's processes meet on. */
interface DemoPlaces {
  dir: string;
  pki: ThrowawayPki;
  uds: string;
  agentPort: number;
  serverHealth: number;
  agentHealth: number;
  /** The agent's --target listeners on ADVERTISE: one to the KAS stand-in, one to a destination the server refuses. */
  kasLocal: number;
  refusedLocal: number;
  kasPort: number;
  backendAddr: string;
}

/** A service on the "node" side and a kube-apiserver stand-in on the "control plane" side, listening on loopback. */
async function startStandIns(pki: ThrowawayPki, servers: net.Server[]): Promise<{ backendAddr: string; kasPort: number }> {
  const payload = Buffer.alloc(256 * 1024, 'k');
  const backend = http.createServer((_req, res) => res.writeHead(200, { 'content-type': 'application/octet-stream' }).end(payload));
  const kas = https.createServer({ cert: fs.readFileSync(pki.serverCert), key: fs.readFileSync(pki.serverKey) }, (req, res) => {
    res
      .writeHead(200, { 'content-type': 'application/json' })
      .end(JSON.stringify({ major: '1', minor: '31', gitVersion: 'v1.31.0-kas-stand-in', path: req.url }));
  });
  servers.push(backend, kas);
  await Promise.all(servers.map((s) => new Promise<void>((r) => s.listen(0, '127.0.0.1', () => r()))));
  return { backendAddr: `127.0.0.1:${(backend.address() as net.AddressInfo).port}`, kasPort: (kas.address() as net.AddressInfo).port };
}

/** `kanal server` and `kanal agent` as children of `scope`, once both are ready. */
async function startKanal(scope: CleanupStack, places: DemoPlaces): Promise<{ server: Child; agent: Child }> {
  const { dir, pki, uds, agentPort, serverHealth, agentHealth, kasLocal, refusedLocal, kasPort, backendAddr } = places;
  const server = spawnKanal(scope, {
    name: 'server',
    args: [
      ...loopbackServerArgs({ pki, agentPort, healthPort: serverHealth }),
      '--uds-name',
      uds,
      '--allowed-destination',
      `127.0.0.1:${kasPort}`,
      '--log-level',
      'info',
    ],
    logFile: path.join(dir, 'server.log'),
  });
  const agent = spawnKanal(scope, {
    name: 'agent',
    args: [
      ...loopbackAgentArgs({
        agentPort,
        caCert: pki.caCert,
        credential: { cert: pki.agentCert, key: pki.agentKey },
        agentID: 'demo-node',
        healthPort: agentHealth,
      }),
      '--bind-address',
      ADVERTISE,
      '--bind-interface-type',
      'none',
      '--target',
      `${kasLocal}:127.0.0.1:${kasPort}`,
      '--target',
      `${refusedLocal}:${backendAddr}`,
      '--log-level',
      'info',
    ],
    logFile: path.join(dir, 'agent.log'),
  });
  await waitHealthy(server, `http://127.0.0.1:${serverHealth}/readyz`, 20_000);
  await waitHealthy(agent, `http://127.0.0.1:${agentHealth}/readyz`, 20_000);
  console.log(`server (pid ${server.pid}) and agent (pid ${agent.pid}) up (agent port ${agentPort}, frontend ${uds})\n`);
  return { server, agent };
}

/** Every direction and frontend, one row each. */
async function runSteps(places: DemoPlaces, time: Timer): Promise<void> {
  const { pki, uds, kasLocal, refusedLocal, backendAddr } = places;
  // The kube-apiserver's side: grpc-js, a gRPC implementation independent of the server's default (h2).
  const grpcJsTransport = await loadTransport('grpc-js');

  await time('CP -> node  HTTP CONNECT over UDS', async () => {
    const s = await httpConnect(await connectUnix(uds), backendAddr);
    const raw = await httpOver(s, backendAddr, '/');
    return { result: statusOf(raw), bytes: raw.length };
  });
  await time('CP -> node  gRPC ProxyService over UDS (upstream client style)', async () => {
    const { conn } = await grpcDial(grpcJsTransport, `unix://${uds}`, backendAddr, { kanal: false });
    const raw = await httpOver(conn, backendAddr, '/');
    return { result: statusOf(raw), bytes: raw.length };
  });
  await time('CP -> node  gRPC ProxyService over UDS (Kanal extensions)', async () => {
    const { conn } = await grpcDial(grpcJsTransport, `unix://${uds}`, backendAddr, { kanal: true });
    const raw = await httpOver(conn, backendAddr, '/');
    return { result: statusOf(raw), bytes: raw.length };
  });
  await time('CP -> node  CONNECT to a closed port', async () => {
    const closed = await freePort();
    try {
      await httpConnect(await connectUnix(uds), `127.0.0.1:${closed}`);
      return { result: 'unexpectedly connected', bytes: 0 };
    } catch (err) {
      return { result: `refused as expected: ${errorMessage(err).split('\n')[0]}`, bytes: 0 };
    }
  });
  await time(`node -> CP  https://${ADVERTISE}:${kasLocal}/version (TLS passes through)`, async () => {
    const body = await new Promise<string>((resolve, reject) => {
      const req = https.get(
        // agent: false: no keep-alive connection left open to hold the agent's shutdown.
        { host: ADVERTISE, port: kasLocal, path: '/version', ca: fs.readFileSync(pki.caCert), timeout: 10_000, agent: false },
        (res) => {
          let text = '';
          res.setEncoding('utf8');
          res.on('data', (c: string) => (text += c));
          res.on('end', () => resolve(`${res.statusCode} ${text}`));
        },
      );
      req.on('error', reject);
    });
    return { result: body.slice(0, 60), bytes: body.length };
  });
  await time(`node -> CP  ${ADVERTISE}:${refusedLocal} -> ${backendAddr} (not allow-listed)`, async () => {
    const s = net.connect({ host: ADVERTISE, port: refusedLocal });
    const closed = await new Promise<string>((resolve) => {
      s.on('data', () => undefined);
      s.once('close', () => resolve('closed by the agent: server refused the destination'));
      s.once('error', () => undefined);
    });
    return { result: closed, bytes: 0 };
  });
}

/** Removes the private keys under dir (the CA's among them), leaving the logs. */
function removeKeys(dir: string): void {
  for (const f of fs.readdirSync(dir, { recursive: true, encoding: 'utf8' })) if (f.endsWith('.key')) fs.rmSync(path.join(dir, f));
}

/** Prints the rows and the server's refusal line; a failed step sets the exit code. */
function report(rows: readonly Row[], server: Child, agent: Child): void {
  const width = Math.max(...rows.map((r) => r.what.length));
  for (const r of rows)
    console.log(`${r.what.padEnd(width)}  ${r.ms.toFixed(1).padStart(7)} ms  ${String(r.bytes).padStart(7)} B  ${r.result}`);
  const refusal = fs
    .readFileSync(server.logFile, 'utf8')
    .split('\n')
    .find((l) => l.includes('refused node dial'));
  if (refusal) console.log(`\nserver log for the refused destination:\n  ${refusal}`);
  const failed = rows.filter((r) => r.result.startsWith('ERROR') || r.result.startsWith('unexpectedly'));
  if (failed.length > 0) {
    console.log(`\n${failed.length} step(s) failed; logs: ${server.logFile}, ${agent.logFile}`);
    process.exitCode = 1;
  } else {
    console.log('\nall demo steps behaved as expected');
  }
}

async function main(): Promise<void> {
  const keep = process.argv.includes('--keep');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kanal-demo-'));
  removeOnExit.add(dir);
  // Children and listeners; the directory stays without its keys when a step failed (its logs).
  const scope = new CleanupStack();
  const servers: net.Server[] = [];
  cleanUpOnSignals(async () => {
    console.log('\nkanal demo: stopping');
    await scope.run();
    for (const s of servers) s.close();
    fs.rmSync(dir, { recursive: true, force: true });
  });
  const rows: Row[] = [];
  const time: Timer = async (what, fn) => {
    const t0 = performance.now();
    try {
      const r = await fn();
      rows.push({ what, ...r, ms: performance.now() - t0 });
    } catch (err) {
      rows.push({ what, result: `ERROR ${errorMessage(err)}`, bytes: 0, ms: performance.now() - t0 });
    }
  };
  try {
    console.log(`kanal demo: working in ${dir}`);
    console.log(`kanal demo: running ${kanalCommand().join(' ')}`);
    const pki = await writeThrowawayPki(dir, { serverIps: [ADVERTISE] });
    const { backendAddr, kasPort } = await startStandIns(pki, servers);
    const [agentPort, serverHealth, agentHealth, kasLocal, refusedLocal] = await Promise.all([
      freePort(),
      freePort(),
      freePort(),
      freePort(ADVERTISE),
      freePort(ADVERTISE),
    ]);
    const uds = path.join(dir, 'konnectivity.sock');
    const places: DemoPlaces = { dir, pki, uds, agentPort, serverHealth, agentHealth, kasLocal, refusedLocal, kasPort, backendAddr };
    const { server, agent } = await startKanal(scope, places);
    await runSteps(places, time);
    report(rows, server, agent);
    if (keep) {
      console.log(`\nkanal demo: kept running until Ctrl-C; frontend ${uds}, metrics http://127.0.0.1:${serverHealth}/metrics`);
      await new Promise<never>(() => setInterval(() => undefined, 1 << 30));
    }
  } finally {
    await scope.run();
    for (const s of servers) s.close();
    if (process.exitCode === 1) {
      removeKeys(dir);
      removeOnExit.delete(dir);
    } else {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  }
}

main().catch((err: Error) => {
  console.error(`demo failed: ${err.stack ?? err.message}`);
  process.exitCode = 1;
});
