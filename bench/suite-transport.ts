/**
 * 1b. The gRPC transport alone: one stream of 32 KiB DATA packets over mutual
 * TLS on loopback, in process (client in the driver, server in a worker
 * thread, so each side has a core as two processes would), for each pairing
 * of Kanal's h2 transport and the grpc-js one, next to a raw TLS socket
 * carrying the same bytes. What section 1 cannot separate: the framing and
 * flow control cost of the transport, without tunnels, dials or a backend.
 */
import fs from 'node:fs';
import tls from 'node:tls';
import { Worker } from 'node:worker_threads';
import { createH2Channel } from '../src/transport/h2/index.js';
import { createGrpcJsChannel } from '../src/transport/grpc-js/index.js';
import type { GrpcChannel } from '../src/transport/transport.js';
import { PacketType } from '../src/wire/packet.js';
import { AGENT_SERVICE_CONNECT } from '../src/wire/metadata.js';
import { median, spread } from './stats.js';
import type { Env } from './env.js';
import type { Row } from './report.js';

const CHUNK = 32 * 1024;

type Kind = 'h2' | 'grpc-js' | 'tls';

interface TlsFiles {
  ca: Buffer;
  serverCert: Buffer;
  serverKey: Buffer;
  clientCert: Buffer;
  clientKey: Buffer;
}

/** The pairings measured, client first; the raw TLS socket is the reference every ratio divides by. */
const PAIRS: { id: string; label: string; client: Kind; server: Kind }[] = [
  { id: 'tls', label: 'raw TLS socket (reference)', client: 'tls', server: 'tls' },
  { id: 'h2.h2', label: 'h2 client -> h2 server', client: 'h2', server: 'h2' },
  { id: 'grpc-js.grpc-js', label: 'grpc-js client -> grpc-js server', client: 'grpc-js', server: 'grpc-js' },
  { id: 'h2.grpc-js', label: 'h2 client -> grpc-js server', client: 'h2', server: 'grpc-js' },
  { id: 'grpc-js.h2', label: 'grpc-js client -> h2 server', client: 'grpc-js', server: 'h2' },
];

/** Worker: a TLS listener feeding the chosen server; answers once `total` bytes arrived. */
const WORKER = `
const { parentPort, workerData } = require('node:worker_threads');
(async () => {
  const tls = await import('node:tls');
  const { kind, total, files, h2Url, grpcJsUrl } = workerData;
  const onTls = (cb) => {
    const server = tls.createServer({ ca: files.ca, cert: files.serverCert, key: files.serverKey,
      requestCert: true, rejectUnauthorized: true, ALPNProtocols: ['h2'] }, cb);
    return new Promise((r) => server.listen(0, '127.0.0.1', () => r(server)));
  };
  let transport;
  const handlers = { agentConnect: (inc) => {
    const st = inc.accept({});
    let got = 0;
    st.on('packet', (p) => {
      if (p.type !== 4) return;
      got += p.data.length;
      if (got === total) st.send({ type: 4, connectID: 1, error: String(got), data: new Uint8Array(0) });
    });
  } };
  let server;
  if (kind === 'tls') {
    server = await onTls((s) => { let got = 0; s.on('data', (c) => { got += c.length; if (got === total) s.write('done'); }); s.on('error', () => {}); });
  } else {
    const mod = kind === 'h2' ? await import(h2Url) : await import(grpcJsUrl);
    transport = kind === 'h2' ? mod.h2Transport.createServer(handlers, { maxReceiveMessageBytes: 4 << 20 })
                              : mod.createGrpcJsServer(handlers, { maxReceiveMessageBytes: 4 << 20 });
    server = await onTls((s) => transport.injectConnection(s));
  }
  parentPort.postMessage({ port: server.address().port });
  parentPort.once('message', async () => {
    if (transport) await transport.close(100);
    server.close();
    parentPort.close();
  });
})();
`;

async function startServer(kind: Kind, files: TlsFiles, total: number): Promise<{ target: string; stop(): Promise<void> }> {
  const worker = new Worker(WORKER, {
    eval: true,
    workerData: {
      kind,
      total,
      files,
      h2Url: new URL('../src/transport/h2/index.js', import.meta.url).href,
      grpcJsUrl: new URL('../src/transport/grpc-js/index.js', import.meta.url).href,
    },
  });
  const { port } = await new Promise<{ port: number }>((resolve, reject) => {
    worker.once('message', resolve);
    worker.once('error', reject);
  });
  return {
    target: `127.0.0.1:${port}`,
    stop: async () => {
      const exited = new Promise((r) => worker.once('exit', r));
      worker.postMessage('stop');
      await Promise.race([exited, new Promise((r) => setTimeout(r, 2000))]);
      await worker.terminate();
    },
  };
}

interface Run {
  mbps: number;
  /** CPU of the whole process (both threads, so both sides) per GB carried. */
  cpuSPerGB: number;
}

/** Resolves when `w` may take more, or has closed (the byte count then says what was lost). */
function drainOrClose(w: { once(event: 'drain' | 'close', f: () => void): unknown }): Promise<void> {
  return new Promise<void>((resolve) => {
    w.once('drain', resolve);
    w.once('close', resolve);
  });
}

async function grpcRun(channel: GrpcChannel, total: number): Promise<Run> {
  const stream = await channel.openStream(AGENT_SERVICE_CONNECT, {}, 10_000);
  const reply = new Promise<string>((resolve) => stream.on('packet', (p) => p.type === PacketType.DATA && resolve(p.error)));
  const data = Buffer.alloc(CHUNK, 0x5a);
  const cpu0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  for (let sent = 0; sent < total; sent += CHUNK) {
    if (!stream.send({ type: PacketType.DATA, connectID: 1, error: '', data })) await drainOrClose(stream);
  }
  const got = await reply;
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  const cpu = process.cpuUsage(cpu0);
  stream.end();
  await new Promise<void>((r) => (stream.closed ? r() : stream.once('close', () => r())));
  if (Number(got) !== total) throw new Error(`the server counted ${got} bytes of ${total}`);
  return { mbps: total / 1e6 / secs, cpuSPerGB: (cpu.user + cpu.system) / 1e6 / (total / 1e9) };
}

async function tlsRun(target: string, files: TlsFiles, total: number): Promise<Run> {
  const [host, port] = target.split(':');
  const socket = tls.connect({
    host,
    port: Number(port),
    ca: files.ca,
    cert: files.clientCert,
    key: files.clientKey,
    ALPNProtocols: ['h2'],
  });
  await new Promise<void>((resolve, reject) => {
    socket.once('secureConnect', resolve);
    socket.once('error', reject);
  });
  const done = new Promise<void>((r) => socket.once('data', () => r()));
  const data = Buffer.alloc(CHUNK, 0x5a);
  const cpu0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  for (let sent = 0; sent < total; sent += CHUNK) {
    if (!socket.write(data)) await drainOrClose(socket);
  }
  await done;
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  const cpu = process.cpuUsage(cpu0);
  socket.destroy();
  return { mbps: total / 1e6 / secs, cpuSPerGB: (cpu.user + cpu.system) / 1e6 / (total / 1e9) };
}

/** One timed run of a pairing on a fresh server (and, for gRPC, after an untimed run on the same channel). */
async function measure(files: TlsFiles, client: Kind, server: Kind, total: number): Promise<Run> {
  const srv = await startServer(server, files, total);
  try {
    if (client === 'tls') return await tlsRun(srv.target, files, total);
    const opts = { target: srv.target, tls: { ca: files.ca, cert: files.clientCert, key: files.clientKey } };
    const channel = client === 'h2' ? createH2Channel(opts) : createGrpcJsChannel(opts);
    try {
      await grpcRun(channel, total); // warm-up: JIT and receive windows
      return await grpcRun(channel, total);
    } finally {
      channel.close();
    }
  } finally {
    await srv.stop();
  }
}

export async function runTransport(env: Env): Promise<Row[]> {
  const files: TlsFiles = {
    ca: fs.readFileSync(env.pki.caCert),
    serverCert: fs.readFileSync(env.pki.serverCert),
    serverKey: fs.readFileSync(env.pki.serverKey),
    clientCert: fs.readFileSync(env.pki.agentCert),
    clientKey: fs.readFileSync(env.pki.agentKey),
  };
  const total = env.params.transportBytes;
  const runs = new Map<string, Run[]>(PAIRS.map((p) => [p.id, []]));
  for (let rep = 0; rep < env.params.reps; rep++) {
    // Alternate the order, as the other sections do, so no pairing always runs first.
    const order = rep % 2 === 0 ? PAIRS : [...PAIRS].reverse();
    for (const p of order) {
      env.progress(`transport: ${p.label}, run ${rep + 1} of ${env.params.reps}`);
      runs.get(p.id)!.push(await measure(files, p.client, p.server, total));
    }
  }
  const reference = median(runs.get('tls')!.map((r) => r.mbps));
  return PAIRS.map((p): Row => {
    const r = runs.get(p.id)!;
    const mbps = r.map((x) => x.mbps);
    return {
      id: `transport.${p.id}`,
      section: 'transport',
      label: p.label,
      values: {
        mbps: median(mbps),
        ratio: median(mbps) / reference,
        spread: spread(mbps),
        cpuSPerGB: median(r.map((x) => x.cpuSPerGB)),
      },
      runs: mbps,
    };
  });
}
