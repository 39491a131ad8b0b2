/**
 * Throughput of one gRPC stream over mutual TLS on loopback: 256 MiB of
 * 32 KiB DATA packets, client in this thread, server in a worker thread (so
 * each side has a core, as with two processes). Printed with t.log, not
 * asserted; the byte count is.
 */
import test, { type ExecutionContext } from 'ava';
import { Worker } from 'node:worker_threads';
import { createH2Channel } from '../../src/transport/h2/index.js';
import type { GrpcChannel } from '../../src/transport/transport.js';
import { PacketType } from '../../src/wire/packet.js';
import { AGENT_SERVICE_CONNECT } from '../../src/wire/metadata.js';
import { createGrpcJsChannel, throwawayTls, type TlsFiles } from '../helpers/grpc-js-peer.js';
import tls from 'node:tls';
import { drainOrClose } from '../helpers/memory-stream.js';

const TOTAL = 256 * 1024 * 1024;
const CHUNK = 32 * 1024;

type Kind = 'h2' | 'grpc-js' | 'tls';

/** Worker: a TLS listener feeding the chosen server; replies once TOTAL bytes arrived. */
const WORKER = `
const { parentPort, workerData } = require('node:worker_threads');
(async () => {
  const tls = await import('node:tls');
  const { kind, total, files, h2Url, peerUrl } = workerData;
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
    const mod = kind === 'h2' ? await import(h2Url) : await import(peerUrl);
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

async function startServer(kind: Kind, files: TlsFiles): Promise<{ target: string; stop(): Promise<void> }> {
  const worker = new Worker(WORKER, {
    eval: true,
    workerData: {
      kind,
      total: TOTAL,
      files,
      h2Url: new URL('../../src/transport/h2/index.js', import.meta.url).href,
      peerUrl: new URL('../helpers/grpc-js-peer.js', import.meta.url).href,
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
  cpuMsPerGB: number;
}

async function grpcRun(channel: GrpcChannel): Promise<Run> {
  const stream = await channel.openStream(AGENT_SERVICE_CONNECT, {}, 5000);
  const reply = new Promise<string>((resolve) => stream.on('packet', (p) => p.type === PacketType.DATA && resolve(p.error)));
  const data = Buffer.alloc(CHUNK, 0x5a);
  const cpu0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  for (let sent = 0; sent < TOTAL; sent += CHUNK) {
    if (!stream.send({ type: PacketType.DATA, connectID: 1, error: '', data })) await drainOrClose(stream);
  }
  const got = await reply;
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  const cpu = process.cpuUsage(cpu0);
  stream.end();
  await new Promise<void>((r) => (stream.closed ? r() : stream.once('close', () => r())));
  if (Number(got) !== TOTAL) throw new Error(`server got ${got}`);
  return { mbps: TOTAL / 1e6 / secs, cpuMsPerGB: (cpu.user + cpu.system) / 1000 / (TOTAL / 1e9) };
}

async function tlsRun(target: string, files: TlsFiles): Promise<Run> {
  const [host, port] = target.split(':');
  const socket = tls.connect({
    host,
    port: Number(port),
    ca: files.ca,
    cert: files.clientCert,
    key: files.clientKey,
    ALPNProtocols: ['h2'],
  });
  await new Promise<void>((r) => socket.once('secureConnect', () => r()));
  const done = new Promise<void>((r) => socket.once('data', () => r()));
  const data = Buffer.alloc(CHUNK, 0x5a);
  const cpu0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  for (let sent = 0; sent < TOTAL; sent += CHUNK) {
    if (!socket.write(data)) await new Promise((r) => socket.once('drain', r));
  }
  await done;
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  const cpu = process.cpuUsage(cpu0);
  socket.destroy();
  return { mbps: TOTAL / 1e6 / secs, cpuMsPerGB: (cpu.user + cpu.system) / 1000 / (TOTAL / 1e9) };
}

async function measure(t: ExecutionContext, client: Kind, server: Kind): Promise<Run> {
  const files = await throwawayTls();
  const srv = await startServer(server, files);
  try {
    if (client === 'tls') return await tlsRun(srv.target, files);
    const opts = { target: srv.target, tls: { ca: files.ca, cert: files.clientCert, key: files.clientKey } };
    const channel = client === 'h2' ? createH2Channel(opts) : createGrpcJsChannel(opts);
    try {
      await grpcRun(channel); // warm-up
      return await grpcRun(channel);
    } finally {
      channel.close();
    }
  } finally {
    await srv.stop();
    t.pass();
  }
}

test.serial('throughput: 256 MiB of 32 KiB DATA packets over TLS, one stream', async (t) => {
  const rows: [string, Run][] = [];
  rows.push(['raw TLS socket (reference)', await measure(t, 'tls', 'tls')]);
  rows.push(['h2 client → h2 server', await measure(t, 'h2', 'h2')]);
  rows.push(['grpc-js client → grpc-js server', await measure(t, 'grpc-js', 'grpc-js')]);
  rows.push(['h2 client → grpc-js server', await measure(t, 'h2', 'grpc-js')]);
  rows.push(['grpc-js client → h2 server', await measure(t, 'grpc-js', 'h2')]);
  for (const [name, r] of rows) {
    t.log(`${name.padEnd(32)} ${r.mbps.toFixed(0).padStart(5)} MB/s   CPU (both sides) ${r.cpuMsPerGB.toFixed(0).padStart(5)} ms/GB`);
  }
});
