/**
 * Bench worker: one hostile agent, as a node whose credential an attacker
 * holds would behave (docs/trust-model.md, "what one credential may cost").
 * It opens one Connect stream negotiating every Kanal feature (resume
 * included), says DRAIN so its tenant's own dials go to the honest agent,
 * then dials an allowed bulk source node → control plane, again and again:
 * each connection asks the source for endless bytes and grants the server
 * `increment` bytes of credit at once, and none is ever acknowledged. What
 * the server keeps for resend (and what it does about the credit) is what the
 * bench measures; this process only counts what it received.
 */
import fs from 'node:fs';
import { issueAgentCertificate, type ThrowawayPki } from '../kit/pki/throwaway-pki.js';
import { serveCommands } from './rpc.js';
import { BULK_HEADER_BYTES, BULK_MODE } from './loadgen-protocol.js';
import { isTransportName, loadTransport } from '../src/transport/choice.js';
import type { GrpcChannel } from '../src/transport/transport.js';
import type { PacketStream } from '../src/transport/packet-stream.js';
import { AGENT_SERVICE_CONNECT, MD_AGENT_ID, MD_KANAL_FEATURES } from '../src/wire/metadata.js';
import { ALL_FEATURES, formatFeatures } from '../src/wire/features.js';
import { PacketType } from '../src/wire/packet.js';

export interface HostileAttackArgs {
  target: string;
  pki: ThrowawayPki;
  transport: string;
  /** The TLS server name (SNI): names the tenant. */
  serverName: string;
  agentID: string;
  /** host:port of a bulk source on the tenant's allow-list. */
  address: string;
  /** Connections held open at once; a closed one is dialled again. */
  connections: number;
  /** Credit granted on each connection right after its DIAL_RSP, bytes. */
  increment: number;
}

export interface HostileCounters {
  /** DATA payload bytes received from the server. */
  received: number;
  /** Connections the server answered with a connectID. */
  opened: number;
  /** Connections the server ended (CLOSE_RSP, CLOSE_REQ, or DATA carrying an error). */
  closedByServer: number;
  /** Dials the server refused (DIAL_RSP with an error). */
  refused: number;
  /** The first refusal or close reason seen, for the report. */
  firstReason?: string;
  /** The stream ended (the server closed the tunnel). */
  streamClosed: boolean;
}

export type HostileCommands = {
  attack: { args: HostileAttackArgs; result: { ms: number } };
  counters: { args: null; result: HostileCounters };
  stop: { args: null; result: HostileCounters };
};

let channel: GrpcChannel | undefined;
let stream: PacketStream | undefined;
let counters: HostileCounters = { received: 0, opened: 0, closedByServer: 0, refused: 0, streamClosed: false };
let stopped = false;

/** How many dials this process keeps asking for at most, whatever the server answers: the loop is bounded. */
const MAX_DIALS = 100_000;

function header(): Buffer {
  const h = Buffer.alloc(BULK_HEADER_BYTES);
  h[0] = BULK_MODE.source;
  h.writeBigUInt64BE(2n ** 62n, 1);
  return h;
}

serveCommands<HostileCommands>({
  async attack(a) {
    if (!isTransportName(a.transport)) throw new Error(`unknown transport ${a.transport}`);
    const transport = await loadTransport(a.transport);
    const cred = await issueAgentCertificate(a.pki, a.agentID);
    const t0 = performance.now();
    stopped = false;
    counters = { received: 0, opened: 0, closedByServer: 0, refused: 0, streamClosed: false };
    channel = transport.createChannel({
      target: a.target,
      tls: {
        ca: fs.readFileSync(a.pki.caCert),
        cert: fs.readFileSync(cred.cert),
        key: fs.readFileSync(cred.key),
        serverName: a.serverName,
      },
    });
    const s = await channel.openStream(
      AGENT_SERVICE_CONNECT,
      { [MD_AGENT_ID]: a.agentID, [MD_KANAL_FEATURES]: formatFeatures(ALL_FEATURES) },
      30_000,
    );
    stream = s;
    let dials = 0;
    const open = new Set<number>();
    const dial = (): void => {
      if (stopped || dials >= MAX_DIALS) return;
      dials++;
      s.send({ type: PacketType.DIAL_REQ, protocol: 'tcp', address: a.address, random: BigInt(dials) });
    };
    const ended = (connectID: number, reason: string): void => {
      if (!open.delete(connectID)) return;
      counters.closedByServer++;
      counters.firstReason ??= reason;
      dial();
    };
    s.on('packet', (p) => {
      switch (p.type) {
        case PacketType.DIAL_RSP:
          if (p.error !== '') {
            counters.refused++;
            counters.firstReason ??= p.error;
            return;
          }
          counters.opened++;
          open.add(p.connectID);
          s.send({ type: PacketType.DATA, connectID: p.connectID, error: '', data: header() });
          s.send({ type: PacketType.KANAL_WINDOW, connectID: p.connectID, increment: a.increment });
          return;
        case PacketType.DATA:
          counters.received += p.data.length;
          if (p.error !== '') ended(p.connectID, p.error);
          return;
        case PacketType.CLOSE_REQ:
          s.send({ type: PacketType.CLOSE_RSP, connectID: p.connectID, error: '' });
          ended(p.connectID, 'CLOSE_REQ from the server');
          return;
        case PacketType.CLOSE_RSP:
          ended(p.connectID, p.error || 'CLOSE_RSP from the server');
          return;
        default:
          return; // the server's own credit, half-closes, resume lists: a hostile agent ignores them
      }
    });
    s.on('close', () => {
      counters.streamClosed = true;
    });
    // Preferred for nothing: its tenant's kube-apiserver dials reach the honest agent.
    s.send({ type: PacketType.DRAIN });
    for (let i = 0; i < a.connections; i++) dial();
    return { ms: performance.now() - t0 };
  },
  counters() {
    return { ...counters };
  },
  stop() {
    stopped = true;
    stream?.destroy();
    channel?.close();
    stream = undefined;
    channel = undefined;
    return { ...counters };
  },
});
