/**
 * Bench worker: many agents in one process. Each is a real agent tunnel
 * (src/agent/server-connection.ts connectToServer: its own channel, TLS
 * connection, Connect stream and Tunnel) with a distinct agentID and its own
 * client certificate; starting one `kanal agent` process per agent would
 * measure Node, not Kanal.
 */
import fs from 'node:fs';
import { pino } from 'pino';
import { issueAgentCertificate, type ThrowawayPki } from '../kit/pki/throwaway-pki.js';
import { serveCommands } from './rpc.js';
import { connectToServer, type ServerConnection } from '../src/agent/server-connection.js';
import { isTransportName, loadTransport } from '../src/transport/choice.js';
import { ALL_FEATURES } from '../src/wire/features.js';
import { DialError } from '../src/tunnel/errors.js';
import { errorMessage } from '../src/common/error-message.js';

export type SwarmCommands = {
  connect: {
    /** Agents `${idPrefix}-${from}` … `${idPrefix}-${from + count - 1}`, each with its own certificate (CN = agentID) from `pki`. */
    args: { target: string; pki: ThrowawayPki; transport: string; idPrefix: string; from: number; count: number; concurrency: number };
    result: { connected: number; errors: number; firstError?: string; ms: number };
  };
  closeAll: { args: null; result: null };
};

const connections: ServerConnection[] = [];
const log = pino({ level: 'silent' });

serveCommands<SwarmCommands>({
  async connect(a) {
    if (!isTransportName(a.transport)) throw new Error(`unknown transport ${a.transport}`);
    const transport = await loadTransport(a.transport);
    const ca = fs.readFileSync(a.pki.caCert);
    let next = a.from;
    const end = a.from + a.count;
    let errors = 0;
    let firstError: string | undefined;
    const t0 = performance.now();
    await Promise.all(
      Array.from({ length: Math.min(a.concurrency, a.count) }, async () => {
        while (next < end) {
          const id = next++;
          const agentID = `${a.idPrefix}-${id}`;
          try {
            const cred = await issueAgentCertificate(a.pki, agentID);
            const tls = { ca, cert: fs.readFileSync(cred.cert), key: fs.readFileSync(cred.key), serverName: 'localhost' };
            const conn = await connectToServer({
              target: a.target,
              tls,
              agentID,
              agentIdentifiers: `host=${a.idPrefix}-${id}`,
              features: ALL_FEATURES,
              transport,
              dialHandler: () => Promise.reject(new DialError('refused', 'bench agent performs no dials')),
              connectTimeoutMs: 30_000,
              log,
            });
            connections.push(conn);
          } catch (err) {
            errors++;
            firstError ??= errorMessage(err);
          }
        }
      }),
    );
    return { connected: connections.length, errors, firstError, ms: performance.now() - t0 };
  },
  closeAll() {
    for (const c of connections) c.close();
    connections.length = 0;
    return null;
  },
});
