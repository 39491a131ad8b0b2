/**
 * An agent as an attacker holding one node's credential writes it: one
 * Connect stream negotiating every Kanal feature (resume included), dials
 * to allowed destinations (node -> control plane) and answers the server's
 * dials (control plane -> node), granting credit as it pleases and, unless
 * told to, never acknowledging a byte. With `acks` it is an honest reader
 * instead: credit and acknowledgements for everything that arrives.
 */
import type { AgentCredential } from '../../kit/pki/throwaway-pki.js';
import type { Scope } from '../../kit/launch/cleanup-scope.js';
import { AGENT_SERVICE_CONNECT, MD_AGENT_ID, MD_AGENT_IDENTIFIERS, MD_KANAL_FEATURES } from '../../src/wire/metadata.js';
import { ALL_FEATURES, formatFeatures } from '../../src/wire/features.js';
import { PacketType, type Packet } from '../../src/wire/packet.js';
import { DEFAULT_LIMITS } from '../../src/tunnel/limits.js';
import type { PacketStream } from '../../src/transport/packet-stream.js';
import { agentChannel } from './raw-agent.js';
import type { Workspace } from './workspace.js';

export interface HostileAgentSpec {
  agentID: string;
  credential: AgentCredential;
  /** Credit granted at once on each connection, on top of the first window. */
  increment: number;
  /** Then credit for every byte that arrives (a reader that keeps up). */
  creditAsReceived?: boolean;
  /** Acknowledge what arrives (an honest agent); default never. */
  acks?: boolean;
  /** agentIdentifiers to announce (e.g. host=... so destHost routes the KAS's dials here). */
  identifiers?: string;
  /** Send DRAIN at once: the tenant's dials prefer other agents. */
  drain?: boolean;
}

export interface HostileConnection {
  readonly connectID: number;
  received: number;
  /** Set when the server closed it: its reason. */
  closed?: string;
}

export interface HostileAgent {
  readonly stream: PacketStream;
  readonly connections: Map<number, HostileConnection>;
  /** Dials `address` through the server; resolves once it answered, rejects with its refusal. */
  dial(address: string): Promise<HostileConnection>;
  /** Sends `bytes` on a connection within the server's credit (an echo returns them). */
  sendWithinCredit(connectID: number, bytes: number): void;
  /** Total DATA bytes received. */
  received(): number;
}

export async function hostileAgent(
  scope: Scope,
  ws: Workspace,
  server: { agentPort: number },
  spec: HostileAgentSpec,
): Promise<HostileAgent> {
  const channel = agentChannel(scope, ws, server, spec.credential);
  const metadata: Record<string, string> = { [MD_AGENT_ID]: spec.agentID, [MD_KANAL_FEATURES]: formatFeatures(ALL_FEATURES) };
  if (spec.identifiers) metadata[MD_AGENT_IDENTIFIERS] = spec.identifiers;
  const stream = await channel.openStream(AGENT_SERVICE_CONNECT, metadata, 10_000);
  scope.teardown(() => stream.destroy());
  const connections = new Map<number, HostileConnection>();
  const dialing = new Map<bigint, { resolve: (c: HostileConnection) => void; reject: (e: Error) => void }>();
  /** The server's credit left on each connection, and what waits to be sent within it. */
  const credit = new Map<number, number>();
  const toSend = new Map<number, number>();
  let total = 0;
  let nextDial = 0n;
  let nextConnectID = 1;
  const opened = (connectID: number): HostileConnection => {
    const c: HostileConnection = { connectID, received: 0 };
    connections.set(connectID, c);
    credit.set(connectID, DEFAULT_LIMITS.windowBytes);
    if (spec.increment > 0) stream.send({ type: PacketType.KANAL_WINDOW, connectID, increment: spec.increment });
    return c;
  };
  const pump = (connectID: number): void => {
    const chunk = Buffer.alloc(64 * 1024, 0x65);
    let left = toSend.get(connectID) ?? 0;
    let room = credit.get(connectID) ?? 0;
    while (left > 0 && room > 0 && !connections.get(connectID)?.closed) {
      const n = Math.min(chunk.length, left, room);
      stream.send({ type: PacketType.DATA, connectID, error: '', data: chunk.subarray(0, n) });
      left -= n;
      room -= n;
    }
    toSend.set(connectID, left);
    credit.set(connectID, room);
  };
  const ended = (connectID: number, reason: string): void => {
    const c = connections.get(connectID);
    if (c && c.closed === undefined) c.closed = reason;
  };
  stream.on('packet', (p: Packet) => {
    switch (p.type) {
      case PacketType.DIAL_RSP: {
        const d = dialing.get(p.random);
        dialing.delete(p.random);
        if (p.error) d?.reject(new Error(p.error));
        else d?.resolve(opened(p.connectID));
        return;
      }
      case PacketType.DIAL_REQ: {
        // The server's dial toward "the node": accepted, then treated like our own.
        const connectID = nextConnectID;
        nextConnectID += 2;
        stream.send({ type: PacketType.DIAL_RSP, random: p.random, connectID, error: '' });
        opened(connectID);
        return;
      }
      case PacketType.DATA: {
        const c = connections.get(p.connectID);
        if (p.error) ended(p.connectID, p.error);
        if (!c || p.data.length === 0) return;
        c.received += p.data.length;
        total += p.data.length;
        if (spec.creditAsReceived || spec.acks)
          stream.send({
            type: PacketType.KANAL_WINDOW,
            connectID: p.connectID,
            increment: p.data.length,
            ...(spec.acks ? { acknowledged: c.received } : {}),
          });
        return;
      }
      case PacketType.KANAL_WINDOW:
        credit.set(p.connectID, (credit.get(p.connectID) ?? 0) + p.increment);
        pump(p.connectID);
        return;
      case PacketType.CLOSE_RSP:
        ended(p.connectID, p.error || 'CLOSE_RSP');
        return;
      case PacketType.CLOSE_REQ:
        ended(p.connectID, 'CLOSE_REQ');
        return;
      default:
        return;
    }
  });
  if (spec.drain) stream.send({ type: PacketType.DRAIN });
  return {
    stream,
    connections,
    dial(address) {
      const random = ++nextDial;
      return new Promise<HostileConnection>((resolve, reject) => {
        dialing.set(random, { resolve, reject });
        stream.send({ type: PacketType.DIAL_REQ, protocol: 'tcp', address, random });
      });
    },
    sendWithinCredit(connectID, bytes) {
      toSend.set(connectID, (toSend.get(connectID) ?? 0) + bytes);
      pump(connectID);
    },
    received: () => total,
  };
}
