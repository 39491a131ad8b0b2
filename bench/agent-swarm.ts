/**
 * Bench worker: many agents in one process. Each is a real agent tunnel
 * (src/agent/server-connection.ts connectToServer: its own channel, TLS
 * connection, Connect stream and Tunnel) with a distinct agentID and its own
 * client certificate; starting one `kanal agent` process per agent would
 * measure Node, not Kanal. Optionally each names a tenant by SNI, performs the
 * dials its server asks for (as `kanal agent` does), and reconnects when the
 * server closes its tunnel (a changed tenant).
 */
import fs from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { pino } from 'pino';
import { issueAgentCertificate, type ThrowawayPki } from '../kit/pki/throwaway-pki.js';
import { serveCommands } from './rpc.js';
import { connectToServer, type ServerConnection } from '../src/agent/server-connection.js';
import { isTransportName, loadTransport } from '../src/transport/choice.js';
import type { Transport } from '../src/transport/transport.js';
import { ALL_FEATURES } from '../src/wire/features.js';
import { DialError } from '../src/tunnel/errors.js';
import { dialTcp } from '../src/tunnel/tcp-dial.js';
import type { DialHandler } from '../src/tunnel/dial-handler.js';
import { errorMessage } from '../src/common/error-message.js';

export interface SwarmConnectArgs {
  target: string;
  pki: ThrowawayPki;
  transport: string;
  /** Agents `${idPrefix}-${from}` … `${idPrefix}-${from + count - 1}`, each with its own certificate (CN = agentID) from `pki`. */
  idPrefix: string;
  from: number;
  count: number;
  concurrency: number;
  /** The TLS server name (SNI) sent and the server certificate checked against; default localhost. */
  serverName?: string;
  /** Perform the server's dials (TCP, as `kanal agent`); default: refuse them. */
  dial?: boolean;
  /** Connect again (every 50 ms until it works) when the server closes the tunnel. */
  reconnect?: boolean;
}

export type SwarmCommands = {
  connect: {
    args: SwarmConnectArgs;
    /** connected: tunnels this worker holds in all; made: those this call opened. */
    result: { connected: number; made: number; errors: number; firstError?: string; ms: number };
  };
  /** Agents of `idPrefix` that connected again (reconnect) at or after `since` (Date.now() ms), and when the last did. */
  reconnected: { args: { idPrefix: string; since: number }; result: { count: number; lastAt: number } };
  closeAll: { args: null; result: null };
};

/** agentID -> its tunnel. */
const connections = new Map<string, ServerConnection>();
/** agentID -> Date.now() of its last reconnect. */
const reconnectedAt = new Map<string, number>();
/** Bumped by closeAll: reconnect loops of an earlier generation give up. */
let generation = 0;
const log = pino({ level: 'silent' });

const refuse: DialHandler = () => Promise.reject(new DialError('refused', 'bench agent performs no dials'));
const perform: DialHandler = (d) => dialTcp(d.address, { timeoutMs: 10_000, signal: d.signal });

async function connectOne(a: SwarmConnectArgs, transport: Transport, ca: Buffer, agentID: string): Promise<ServerConnection> {
  const cred = await issueAgentCertificate(a.pki, agentID);
  const tls = { ca, cert: fs.readFileSync(cred.cert), key: fs.readFileSync(cred.key), serverName: a.serverName ?? 'localhost' };
  return connectToServer({
    target: a.target,
    tls,
    agentID,
    agentIdentifiers: `host=${agentID}`,
    features: ALL_FEATURES,
    transport,
    dialHandler: a.dial ? perform : refuse,
    connectTimeoutMs: 30_000,
    log,
  });
}

/** Holds `conn` as `agentID`'s tunnel; with a.reconnect, opens another when the server closes it. */
function hold(a: SwarmConnectArgs, transport: Transport, ca: Buffer, agentID: string, conn: ServerConnection): void {
  connections.set(agentID, conn);
  if (!a.reconnect) return;
  const gen = generation;
  conn.tunnel.once('close', () => {
    if (gen !== generation || connections.get(agentID) !== conn) return;
    connections.delete(agentID);
    void (async () => {
      while (gen === generation) {
        try {
          const again = await connectOne(a, transport, ca, agentID);
          if (gen !== generation) {
            again.close();
            return;
          }
          reconnectedAt.set(agentID, Date.now());
          hold(a, transport, ca, agentID, again);
          return;
        } catch {
          await sleep(50);
        }
      }
    })();
  });
}

serveCommands<SwarmCommands>({
  async connect(a) {
    if (!isTransportName(a.transport)) throw new Error(`unknown transport ${a.transport}`);
    const transport = await loadTransport(a.transport);
    const ca = fs.readFileSync(a.pki.caCert);
    let next = a.from;
    const end = a.from + a.count;
    let errors = 0;
    let made = 0;
    let firstError: string | undefined;
    const t0 = performance.now();
    await Promise.all(
      Array.from({ length: Math.min(a.concurrency, a.count) }, async () => {
        while (next < end) {
          const agentID = `${a.idPrefix}-${next++}`;
          try {
            hold(a, transport, ca, agentID, await connectOne(a, transport, ca, agentID));
            made++;
          } catch (err) {
            errors++;
            firstError ??= errorMessage(err);
          }
        }
      }),
    );
    return { connected: connections.size, made, errors, firstError, ms: performance.now() - t0 };
  },
  reconnected({ idPrefix, since }) {
    let count = 0;
    let lastAt = 0;
    for (const [id, at] of reconnectedAt) {
      if (!id.startsWith(`${idPrefix}-`) || at < since) continue;
      count++;
      lastAt = Math.max(lastAt, at);
    }
    return { count, lastAt };
  },
  closeAll() {
    generation++;
    for (const c of connections.values()) c.close();
    connections.clear();
    reconnectedAt.clear();
    return null;
  },
});
