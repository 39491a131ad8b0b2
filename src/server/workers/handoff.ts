/**
 * Connections passed between workers (docs/multi-tenant.md, "Workers"). A
 * worker that terminated a connection's TLS and found it belongs to a
 * tenant another worker serves (recognised by its certificate, so the
 * primary could not tell from the ClientHello) relays the plaintext to that
 * worker over a Unix socket in the server's private directory: one JSON line
 * saying what the connection is, then its bytes both ways. Only the
 * server's own processes can reach the directory (mode 0700), so the line is
 * trusted as a listener's decision is.
 */
import fs from 'node:fs';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import type { Logger } from 'pino';
import type { AgentCredential } from '../identity/agent-credential.js';

/** What the worker that recognised the connection decided. */
export interface Handoff {
  kind: 'agent' | 'frontend';
  tenant: string;
  /** The agent's credential (its certificate), when the connection has one. */
  credential?: AgentCredential;
  /** The client's address, for log lines. */
  peer: string;
  /**
   * An agent connection placed by its first stream's token (no server name,
   * no certificate): its receiver judges each stream by its token, as a
   * single process does, instead of taking `tenant` as the connection's.
   */
  byToken?: true;
}

/** Longest handoff line, and how long its sender has to write it. */
const MAX_LINE_BYTES = 8 * 1024;
const LINE_TIMEOUT_MS = 5_000;

/** Relays `socket` (already decrypted) to the worker listening at `path`; either end closing closes both. */
export function forward(socket: Duplex, path: string, handoff: Handoff, log: Logger): void {
  const relay = net.connect(path);
  relay.setNoDelay?.(true);
  relay.write(`${JSON.stringify(handoff)}\n`);
  socket.pipe(relay);
  relay.pipe(socket);
  const done = (err?: Error): void => {
    if (err)
      log.warn({ tenant: handoff.tenant, peer: handoff.peer, err: err.message }, "relaying a connection to its tenant's worker failed");
    socket.destroy();
    relay.destroy();
  };
  relay.once('error', done).once('close', () => done());
  socket.once('error', () => done()).once('close', () => done());
}

function parseHandoff(line: string): Handoff | undefined {
  const v: unknown = JSON.parse(line);
  if (typeof v !== 'object' || v === null) return undefined;
  const kind: unknown = Reflect.get(v, 'kind');
  const tenant: unknown = Reflect.get(v, 'tenant');
  const peer: unknown = Reflect.get(v, 'peer');
  const credential: unknown = Reflect.get(v, 'credential');
  if ((kind !== 'agent' && kind !== 'frontend') || typeof tenant !== 'string' || typeof peer !== 'string') return undefined;
  const c =
    typeof credential === 'object' && credential !== null
      ? { key: String(Reflect.get(credential, 'key')), subject: String(Reflect.get(credential, 'subject')) }
      : undefined;
  const byToken = Reflect.get(v, 'byToken') === true;
  if (byToken && (kind !== 'agent' || c)) return undefined;
  return { kind, tenant, peer, ...(c ? { credential: c } : {}), ...(byToken ? { byToken: true as const } : {}) };
}

/** Accepts relayed connections at `path`; each is handed on with its line, the line's bytes consumed. */
export async function listenForHandoffs(
  path: string,
  take: (socket: net.Socket, handoff: Handoff) => void,
  log: Logger,
): Promise<{ close(): Promise<void> }> {
  const sockets = new Set<net.Socket>();
  const server = net.createServer({ allowHalfOpen: true }, (socket) => {
    sockets.add(socket);
    socket.once('close', () => sockets.delete(socket));
    let head = Buffer.alloc(0);
    const timer = setTimeout(() => socket.destroy(), LINE_TIMEOUT_MS);
    const onData = (chunk: Buffer): void => {
      head = Buffer.concat([head, chunk]);
      const nl = head.indexOf(0x0a);
      if (nl < 0) {
        if (head.length > MAX_LINE_BYTES) socket.destroy();
        return;
      }
      socket.off('data', onData);
      socket.pause();
      clearTimeout(timer);
      let handoff: Handoff | undefined;
      try {
        handoff = parseHandoff(head.subarray(0, nl).toString('utf8'));
      } catch {
        handoff = undefined;
      }
      if (!handoff) {
        log.error('a relayed connection came without a valid handoff line');
        socket.destroy();
        return;
      }
      const rest = head.subarray(nl + 1);
      if (rest.length > 0) socket.unshift(rest);
      take(socket, handoff);
    };
    socket.on('data', onData);
  });
  // A worker that died left its socket file; the directory is the server's own, so nothing else is there.
  fs.rmSync(path, { force: true });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(path, () => {
      server.off('error', reject);
      resolve();
    });
  });
  return {
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        for (const s of sockets) s.destroy();
      }),
  };
}
