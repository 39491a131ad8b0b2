// A Kanal agent against a server that never heard of KEP-2025. Upstream's
// server cannot run here, so a small grpc-js stand-in plays it honestly: it
// decodes with upstream's proto (protobufjs, packet types 0-6 only), answers
// Connect with serverID/serverCount and no `kanal-features`, requires a client
// certificate like upstream with --cluster-ca-cert, ignores a DIAL_REQ from an
// agent (upstream's server drops "unrecognized packet from backend"), and dials
// through the agent the way upstream does (control plane -> node).
//
//   agent (node netns) --veth--> relay CP_ADDR:8091 (cp netns) --> Unix socket --> stand-in (this process)
//
// Expected: the tunnel comes up, the node -> control plane direction is
// refused promptly and clearly (log, /readyz detail), and control plane -> node
// still works through the upstream server.

import test from 'ava';
import { levelAtLeast } from '../../kit/launch/log-reader.js';
import { skippedBecause } from '../helpers/skipped.js';
import fs from 'node:fs';
import net from 'node:net';
import * as grpc from '@grpc/grpc-js';
import protobuf from 'protobufjs';
import { netnsUnavailableReason } from '../../kit/launch/netns.js';
import { Wakeup } from '../helpers/wakeup.js';
import {
  ADVERTISE_IP,
  AGENT_HEALTH_PORT,
  AGENT_ID,
  AGENT_PORT,
  KAS_PORT,
  createTopology,
  destroyAllTopologies,
  startAgent,
  type NsProcess,
  type Topology,
} from '../helpers/node-topology.js';
import { errorMessage } from '../../src/common/error-message.js';

const UPSTREAM_SERVER_ID = 'upstream-konnectivity-0';
const NODE_ECHO_PORT = 9000;

// Upstream's konnectivity-client/proto/client/client.proto (agent.proto's
// AgentService/Connect streams the same Packet). No Kanal extensions.
const UPSTREAM_PROTO = `
syntax = "proto3";
enum PacketType { DIAL_REQ = 0; DIAL_RSP = 1; CLOSE_REQ = 2; CLOSE_RSP = 3; DATA = 4; DIAL_CLS = 5; DRAIN = 6; }
message Packet {
  PacketType type = 1;
  oneof payload {
    DialRequest dialRequest = 2; DialResponse dialResponse = 3; Data data = 4; CloseRequest closeRequest = 5;
    CloseResponse closeResponse = 6; CloseDial closeDial = 7; Drain drain = 8;
  }
}
message DialRequest { string protocol = 1; string address = 2; int64 random = 3; }
message DialResponse { string error = 1; int64 connectID = 2; int64 random = 3; }
message CloseRequest { int64 connectID = 1; }
message CloseResponse { string error = 1; int64 connectID = 2; }
message CloseDial { int64 random = 1; }
message Drain {}
message Data { int64 connectID = 1; string error = 2; bytes data = 3; }
`;
const PbPacket = protobuf.parse(UPSTREAM_PROTO).root.lookupType('Packet');
const UPSTREAM_TYPES = new Set([0, 1, 2, 3, 4, 5, 6]);
const TYPE = { DIAL_REQ: 0, DIAL_RSP: 1, CLOSE_REQ: 2, CLOSE_RSP: 3, DATA: 4, DIAL_CLS: 5, DRAIN: 6 } as const;

interface UpPacket {
  type: number;
  dialRequest?: { protocol: string; address: string; random: string };
  dialResponse?: { error: string; connectID: string; random: string };
  data?: { connectID: string; error: string; data: Buffer };
  closeRequest?: { connectID: string };
  closeResponse?: { error: string; connectID: string };
  closeDial?: { random: string };
  drain?: Record<string, never>;
}

/** int64 fields may be given as decimal strings (fromObject converts them). */
function encode(p: Record<string, unknown>): Buffer {
  return Buffer.from(PbPacket.encode(PbPacket.fromObject(p)).finish());
}

function decode(b: Buffer): UpPacket {
  return PbPacket.toObject(PbPacket.decode(b), { longs: String, enums: Number, bytes: Buffer, defaults: true }) as UpPacket;
}

const connectMethod: grpc.MethodDefinition<UpPacket, Record<string, unknown>> = {
  path: '/AgentService/Connect',
  requestStream: true,
  responseStream: true,
  requestSerialize: (p: UpPacket) => encode(p as unknown as Record<string, unknown>),
  requestDeserialize: decode,
  responseSerialize: encode,
  responseDeserialize: (b: Buffer) => decode(b) as unknown as Record<string, unknown>,
  originalName: 'Connect',
};

type AgentCall = grpc.ServerDuplexStream<UpPacket, Record<string, unknown>>;

/** What the stand-in saw and the one agent stream it holds. */
class UpstreamServer {
  readonly received: UpPacket[] = [];
  readonly agentMetadata: Record<string, string[]>[] = [];
  call: AgentCall | undefined;
  private readonly server = new grpc.Server();
  private readonly arrivals = new Wakeup();

  constructor() {
    this.server.addService(
      { Connect: connectMethod },
      {
        Connect: (call: AgentCall) => {
          const md = call.metadata.getMap();
          this.agentMetadata.push(Object.fromEntries(Object.keys(md).map((k) => [k, call.metadata.get(k).map(String)])));
          if (call.metadata.get('agentid').length !== 1) {
            call.emit('error', { code: grpc.status.INVALID_ARGUMENT, details: 'expected exactly one agentID' });
            return;
          }
          const headers = new grpc.Metadata();
          headers.set('serverID', UPSTREAM_SERVER_ID);
          headers.set('serverCount', '1');
          call.sendMetadata(headers);
          this.call = call;
          call.on('data', (p: UpPacket) => {
            this.received.push(p);
            // Upstream: DIAL_RSP, DATA, CLOSE_RSP and DRAIN are handled; anything else,
            // a DIAL_REQ from an agent included, is ignored.
            this.arrivals.wakeAll();
          });
          call.on('error', () => undefined);
          call.on('end', () => call.end());
        },
      },
    );
  }

  listen(socketPath: string, pki: { caCert: string; serverCert: string; serverKey: string }): Promise<void> {
    const creds = grpc.ServerCredentials.createSsl(
      fs.readFileSync(pki.caCert),
      [{ cert_chain: fs.readFileSync(pki.serverCert), private_key: fs.readFileSync(pki.serverKey) }],
      true,
    );
    return new Promise<void>((resolve, reject) =>
      this.server.bindAsync(`unix:${socketPath}`, creds, (err) => (err ? reject(err) : resolve())),
    );
  }

  send(p: Record<string, unknown>): void {
    if (!this.call) throw new Error('no agent stream');
    this.call.write(p);
  }

  /** Waits (bounded) for a received packet matching pred. */
  async next(pred: (p: UpPacket) => boolean, timeoutMs: number): Promise<UpPacket> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const hit = this.received.find(pred);
      if (hit) return hit;
      const left = deadline - Date.now();
      if (left <= 0)
        throw new Error(
          `upstream stand-in: expected packet not received within ${timeoutMs} ms; got types ${this.received.map((p) => p.type).join(',')}`,
        );
      await this.arrivals.wait(left);
    }
  }

  close(): void {
    this.server.forceShutdown();
  }
}

const unavailable = await netnsUnavailableReason();
test.after.always('destroy any topology or namespace left behind', destroyAllTopologies);
if (unavailable) skippedBecause('agent against an upstream server', unavailable);
const kernelTest = unavailable ? test.skip : test.serial;

let topo: Topology | undefined;
let upstream: UpstreamServer | undefined;
let agent: NsProcess | undefined;
let nodeRelay = '';

test.before(async () => {
  if (unavailable) return;
  const tp = await createTopology();
  topo = tp;
  try {
    upstream = new UpstreamServer();
    const socket = tp.socketPath('upstream-server');
    await upstream.listen(socket, tp.pki);
    // The agent reaches the stand-in over the veth, like any server.
    await tp.services(tp.cp, 'cp-services', [
      { kind: 'relay', name: 'agent-port', listen: { host: tp.cpAddr, port: AGENT_PORT }, to: { path: socket } },
    ]);
    nodeRelay = tp.socketPath('node-kas');
    await tp.services(tp.node, 'node-services', [
      { kind: 'echo', name: 'node-echo', host: tp.nodeAddr, port: NODE_ECHO_PORT },
      { kind: 'relay', name: 'node-kas', listen: { path: nodeRelay }, to: { host: ADVERTISE_IP, port: KAS_PORT } },
    ]);
    agent = await startAgent(tp);
  } catch (err) {
    await tp.destroy(true);
    topo = undefined;
    throw new Error(`${errorMessage(err)}\n(logs kept in ${tp.dir})`, { cause: err });
  }
});

test.after.always('tear down', async () => {
  upstream?.close();
  await topo?.destroy();
});

function need(): { topo: Topology; upstream: UpstreamServer; agent: NsProcess } {
  if (!topo || !upstream || !agent) throw new Error('not started');
  return { topo, upstream, agent };
}

kernelTest('the tunnel comes up without kanal-features, and the agent says node -> control plane is unavailable', async (t) => {
  const { upstream: up, agent: ag } = need();
  const md = up.agentMetadata[0] ?? {};
  t.deepEqual(md.agentid, [AGENT_ID]);
  t.truthy(md['kanal-features'], 'the agent offered its features (an upstream server ignores the header)');
  const line = await ag.waitForLine(
    (l) => typeof l.msg === 'string' && l.msg.includes('server does not support node -> control plane dials'),
    5000,
  );
  t.is(line.serverID, UPSTREAM_SERVER_ID);
  t.true(levelAtLeast(line.level, 'warn'));
  t.like(
    ag.jsonLines().find((l) => l.msg === 'tunnel up'),
    { serverID: UPSTREAM_SERVER_ID, serverCount: 1, features: 'none (upstream server)' },
  );
});

kernelTest('/readyz of the agent is ready and says node -> control plane dials are unavailable', async (t) => {
  const { topo: tp } = need();
  const r = await tp.curl(tp.node, `http://127.0.0.1:${AGENT_HEALTH_PORT}/readyz`, [], 3000);
  t.is(r.status, 200);
  t.regex(r.body, new RegExp(UPSTREAM_SERVER_ID));
  t.regex(r.body, /node -> control plane dials unavailable/);
  t.log(r.body.trim());
});

kernelTest('a client of the agent listener is closed promptly (< 2 s), with a clear log, and nothing is sent upstream', async (t) => {
  const { topo: tp, upstream: up, agent: ag } = need();
  const t0 = Date.now();
  const outcome = await new Promise<{ ms: number; bytes: number; how: string }>((resolve) => {
    const sock = net.connect({ path: nodeRelay });
    let bytes = 0;
    const timer = setTimeout(() => {
      sock.destroy();
      resolve({ ms: Date.now() - t0, bytes, how: 'still open after 10 s' });
    }, 10_000);
    sock.on('data', (c: Buffer) => (bytes += c.length));
    sock.on('error', () => undefined);
    sock.once('connect', () => sock.write('\x16\x03\x01')); // the start of a TLS ClientHello
    sock.once('close', () => {
      clearTimeout(timer);
      resolve({ ms: Date.now() - t0, bytes, how: 'closed' });
    });
  });
  t.is(outcome.how, 'closed');
  t.true(outcome.ms < 2000, `closed after ${outcome.ms} ms`);
  t.is(outcome.bytes, 0);
  t.log(`client connection closed after ${outcome.ms} ms`);

  // A real client in the node namespace fails just as fast.
  const c0 = Date.now();
  const r = await tp.curl(tp.node, `https://${ADVERTISE_IP}:${KAS_PORT}/version`, ['--cacert', tp.pki.caCert], 10_000);
  const curlMs = Date.now() - c0;
  t.is(r.status, 0);
  t.true(curlMs < 2000, `curl failed after ${curlMs} ms`);

  const refusal = await ag.waitForLine(
    (l) => typeof l.msg === 'string' && l.msg.includes('no connected server supports node -> control plane dials'),
    2000,
  );
  t.true(levelAtLeast(refusal.level, 'warn'));
  // The agent did not send a DIAL_REQ the server would silently drop; every
  // packet it sent is one upstream knows.
  t.deepEqual(
    up.received.filter((p) => p.type === TYPE.DIAL_REQ),
    [],
  );
  t.deepEqual(
    up.received.filter((p) => !UPSTREAM_TYPES.has(p.type)),
    [],
  );
});

kernelTest('control plane -> node still works through the upstream server (DIAL_REQ, DATA, CLOSE_REQ)', async (t) => {
  const { topo: tp, upstream: up } = need();
  const random = '7340196723402875123';
  up.send({ type: TYPE.DIAL_REQ, dialRequest: { protocol: 'tcp', address: `${tp.nodeAddr}:${NODE_ECHO_PORT}`, random } });
  const rsp = await up.next((p) => p.type === TYPE.DIAL_RSP && p.dialResponse?.random === random, 5000);
  t.is(rsp.dialResponse?.error, '');
  const connectID = rsp.dialResponse?.connectID ?? '0';
  t.not(connectID, '0');
  const payload = Buffer.from('ping through an upstream server');
  up.send({ type: TYPE.DATA, data: { connectID, data: payload } });
  let echoed = Buffer.alloc(0);
  const deadline = Date.now() + 5000;
  while (echoed.length < payload.length && Date.now() < deadline) {
    await up.next((p) => p.type === TYPE.DATA && p.data?.connectID === connectID, 5000).catch(() => undefined);
    echoed = Buffer.concat(
      up.received.filter((p) => p.type === TYPE.DATA && p.data?.connectID === connectID).map((p) => p.data?.data ?? Buffer.alloc(0)),
    );
    if (echoed.length < payload.length) await new Promise((r) => setTimeout(r, 20));
  }
  t.deepEqual(echoed, payload);
  up.send({ type: TYPE.CLOSE_REQ, closeRequest: { connectID } });
  const closed = await up.next((p) => p.type === TYPE.CLOSE_RSP && p.closeResponse?.connectID === connectID, 5000);
  t.is(closed.closeResponse?.error, '');
  t.deepEqual(
    up.received.filter((p) => !UPSTREAM_TYPES.has(p.type)),
    [],
  );
});

kernelTest('on SIGTERM the agent sends DRAIN and stops cleanly', async (t) => {
  const { upstream: up, agent: ag } = need();
  t.deepEqual(await ag.stop('SIGTERM').then(() => ag.exited), { code: 0, signal: null });
  await up.next((p) => p.type === TYPE.DRAIN, 2000);
  t.deepEqual(
    ag.jsonLines().filter((l) => levelAtLeast(l.level, 'error')),
    [],
  );
  // One tunnel for the whole run: nothing above broke the stream.
  t.is(ag.jsonLines().filter((l) => l.msg === 'tunnel up').length, 1);
  t.is(up.agentMetadata.length, 1);
});
