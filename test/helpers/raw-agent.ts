/**
 * A bare agent for identity and liveness tests: one AgentService/Connect
 * stream with exactly the credential and agentID a test chooses (an honest
 * node, or an attacker holding one node's certificate), on its own TLS
 * connection or on one shared with other streams. It answers every DIAL_REQ
 * with a dial error (so the frontend answers 502 at once) and counts them.
 * Plus a stalling TCP relay, to cut a path silently (no FIN, no RST).
 */
import fs from 'node:fs';
import net from 'node:net';
import type { AgentCredential } from '../../kit/pki/throwaway-pki.js';
import { h2Transport } from '../../src/transport/h2/index.js';
import type { GrpcChannel } from '../../src/transport/transport.js';
import type { PacketStream } from '../../src/transport/packet-stream.js';
import { AGENT_SERVICE_CONNECT, MD_AGENT_ID, MD_KANAL_FEATURES } from '../../src/wire/metadata.js';
import { Feature } from '../../src/wire/features.js';
import { PacketType } from '../../src/wire/packet.js';
import { connectUnix, type Scope, type Workspace } from './kanal-processes.js';

export interface RawAgent {
  readonly agentID: string;
  readonly stream: PacketStream;
  /** DIAL_REQs received so far. */
  dials(): number;
  close(): void;
}

/** A TLS channel to the server's agent port presenting `credential` (none: no client certificate); closed with the scope. */
export function agentChannel(
  scope: Scope,
  ws: Workspace,
  server: { agentPort: number },
  credential: AgentCredential | undefined,
): GrpcChannel {
  const channel = h2Transport.createChannel({
    target: `127.0.0.1:${server.agentPort}`,
    tls: {
      ca: fs.readFileSync(ws.pki.caCert),
      cert: credential && fs.readFileSync(credential.cert),
      key: credential && fs.readFileSync(credential.key),
    },
  });
  scope.teardown(() => channel.close());
  return channel;
}

/**
 * Opens a Connect stream announcing `agentID`; rejects with the server's
 * GrpcStatusError when refused. `channel` shares one TLS connection.
 */
export async function connectRawAgent(
  scope: Scope,
  ws: Workspace,
  server: { agentPort: number },
  credential: AgentCredential | undefined,
  agentID: string,
  channel: GrpcChannel = agentChannel(scope, ws, server, credential),
): Promise<RawAgent> {
  const stream = await channel.openStream(AGENT_SERVICE_CONNECT, { [MD_AGENT_ID]: agentID }, 10_000);
  let dials = 0;
  stream.on('packet', (p) => {
    if (p.type !== PacketType.DIAL_REQ) return;
    dials++;
    stream.send({ type: PacketType.DIAL_RSP, random: p.random, connectID: 0, error: `${agentID} refuses every dial` });
  });
  const close = (): void => stream.destroy();
  scope.teardown(close);
  return { agentID, stream, dials: () => dials, close };
}

/** A bare agent that also asks the server for node -> control plane dials (the node-dial feature), as a hostile node would. */
export interface NodeDialingAgent extends RawAgent {
  /**
   * Sends one DIAL_REQ per address at once and resolves with each DIAL_RSP's
   * error ('' when the server connected; such a connection is closed at once),
   * or 'no answer' for those the stream's end left unanswered.
   */
  dialAll(addresses: readonly string[]): Promise<string[]>;
}

let nextDialID = 1n;

/** connectRawAgent, negotiating node-dial; rejects with the server's GrpcStatusError when refused. */
export async function connectNodeDialingAgent(
  scope: Scope,
  ws: Workspace,
  server: { agentPort: number },
  credential: AgentCredential | undefined,
  agentID: string,
  channel: GrpcChannel = agentChannel(scope, ws, server, credential),
): Promise<NodeDialingAgent> {
  const stream = await channel.openStream(AGENT_SERVICE_CONNECT, { [MD_AGENT_ID]: agentID, [MD_KANAL_FEATURES]: Feature.NodeDial }, 10_000);
  let dials = 0;
  const answers = new Map<bigint, (error: string) => void>();
  stream.on('packet', (p) => {
    if (p.type === PacketType.DIAL_REQ) {
      dials++;
      stream.send({ type: PacketType.DIAL_RSP, random: p.random, connectID: 0, error: `${agentID} refuses every dial` });
    } else if (p.type === PacketType.DIAL_RSP) {
      answers.get(p.random)?.(p.error);
      answers.delete(p.random);
      if (!p.error) stream.send({ type: PacketType.CLOSE_REQ, connectID: p.connectID });
    }
  });
  stream.once('close', () => {
    for (const answer of answers.values()) answer('no answer');
    answers.clear();
  });
  const close = (): void => stream.destroy();
  scope.teardown(close);
  return {
    agentID,
    stream,
    dials: () => dials,
    close,
    dialAll: (addresses) =>
      Promise.all(
        addresses.map(
          (address) =>
            new Promise<string>((resolve) => {
              if (stream.closed) return resolve('no answer');
              const random = nextDialID++;
              answers.set(random, resolve);
              stream.send({ type: PacketType.DIAL_REQ, protocol: 'tcp', address, random });
            }),
        ),
      ),
  };
}

/**
 * CONNECT through a server's Unix-socket frontend; resolves with the HTTP
 * status once the response head arrived (0 if none within timeoutMs), then
 * closes the connection.
 */
export async function connectStatus(server: { uds: string }, address: string, timeoutMs = 15_000): Promise<number> {
  const s = await connectUnix(server.uds);
  s.on('error', () => undefined);
  try {
    const head = new Promise<string>((resolve) => {
      let got = '';
      const timer = setTimeout(() => resolve(got), timeoutMs);
      const done = (): void => {
        clearTimeout(timer);
        resolve(got);
      };
      s.on('data', (c: Buffer) => {
        got += c.toString('latin1');
        if (got.includes('\r\n\r\n')) done();
      });
      s.once('close', done);
    });
    s.write(`CONNECT ${address} HTTP/1.1\r\nHost: ${address}\r\n\r\n`);
    return Number(/^HTTP\/1\.1 (\d{3})/.exec(await head)?.[1] ?? 0);
  } finally {
    s.destroy();
  }
}

export interface StallingRelay {
  readonly port: number;
  /** Stops forwarding and reading on every connection open now, without closing any. */
  stall(): void;
  /** Connections relayed so far. */
  connections(): number;
}

/**
 * A TCP relay on 127.0.0.1 to `target`. stall() freezes the open
 * connections the way a dead path does: nothing passes, nothing is read, no
 * FIN or RST; new connections are relayed normally.
 */
export async function startStallingRelay(scope: Scope, target: { host: string; port: number }): Promise<StallingRelay> {
  const pairs: { a: net.Socket; b: net.Socket; stalled: boolean }[] = [];
  const server = net.createServer((a) => {
    const b = net.connect(target.port, target.host);
    const pair = { a, b, stalled: false };
    pairs.push(pair);
    for (const [from, to] of [
      [a, b],
      [b, a],
    ] as const) {
      from.on('error', () => undefined);
      from.on('data', (c: Buffer) => void (pair.stalled || to.write(c)));
      from.on('close', () => pair.stalled || to.destroy());
    }
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  scope.teardown(
    () =>
      new Promise<void>((resolve) => {
        for (const p of pairs) {
          p.a.destroy();
          p.b.destroy();
        }
        server.close(() => resolve());
      }),
  );
  return {
    port: (server.address() as net.AddressInfo).port,
    stall() {
      for (const p of pairs) {
        p.stalled = true;
        p.a.pause();
        p.b.pause();
      }
    },
    connections: () => pairs.length,
  };
}
