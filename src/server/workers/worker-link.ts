/**
 * A worker's side of the IPC channel (docs/multi-tenant.md, "Workers"): it
 * takes the connections the primary hands over and answers its requests.
 * A worker whose primary is gone stops: it has no listener of its own.
 */
import net from 'node:net';
import type { Logger } from 'pino';
import type { Readiness } from '../../common/health-server.js';
import { asToWorker, type ToPrimary } from './messages.js';

/** What a worker's server offers the primary. */
export interface WorkerHost {
  adoptAgent(socket: net.Socket, head: Buffer): void;
  adoptFrontend(socket: net.Socket, head: Buffer): void;
  /** One cluster: a connection of its plain listener `index` (HTTP proxy, SOCKS5). */
  adoptExtra(index: number, socket: net.Socket): void;
  /** A connection on the Unix socket of `tenant`, which the primary binds for the workers sharing it. */
  adoptTenantSocket(tenant: string, socket: net.Socket): void;
  metricsTexts(): Promise<string[]>;
  readiness(query?: URLSearchParams): Readiness;
  /** The agents this worker holds now (all its tenants'). */
  agentCount(): number;
  /** The agents of each of its tenants now (none for one cluster). */
  agentsByTenant(): [string, number][];
  /** The tenants this worker serves now. */
  tenantsServed(): string[];
  /** The tenants file read again, or one cluster's clients file (nothing without one). */
  reload(): Promise<unknown>;
}

function send(message: ToPrimary): void {
  process.send?.(message);
}

/** How often the agents held are compared with what the primary was last told: a connect takes longer than this anyway. */
const AGENTS_CHECK_MS = 100;

/** Tells the primary the agents held, in all and per tenant, whenever that changes; stops with the channel. */
function reportAgents(host: WorkerHost): void {
  let told = '';
  const check = (): void => {
    const count = host.agentCount();
    const tenants = host.agentsByTenant();
    const now = `${count} ${tenants.map(([name, n]) => `${name}=${n}`).join(',')}`;
    if (now === told) return;
    told = now;
    send({ type: 'agents', count, tenants });
  };
  const timer = setInterval(check, AGENTS_CHECK_MS);
  timer.unref();
  process.once('disconnect', () => clearInterval(timer));
  check();
}

/** Serves the primary's messages; `primaryGone` runs once when the channel closes. */
export function linkToPrimary(host: WorkerHost, log: Logger, primaryGone: () => void): void {
  process.on('message', (raw: unknown, handle: unknown) => {
    const m = asToWorker(raw);
    if (!m) {
      log.error('a message from the primary that this worker does not know');
      if (handle instanceof net.Socket) handle.destroy();
      return;
    }
    if (m.type === 'connection') {
      if (!(handle instanceof net.Socket)) return;
      if (m.port === 'extra') {
        host.adoptExtra(m.index, handle);
        return;
      }
      if (m.port === 'tenant-uds') {
        host.adoptTenantSocket(m.tenant, handle);
        return;
      }
      const head = Buffer.from(m.head, 'base64');
      if (m.port === 'agent') host.adoptAgent(handle, head);
      else host.adoptFrontend(handle, head);
      return;
    }
    const reply = async (): Promise<ToPrimary> => {
      switch (m.what) {
        case 'metrics':
          return { type: 'reply', id: m.id, metrics: await host.metricsTexts() };
        case 'readiness':
          return {
            type: 'reply',
            id: m.id,
            readiness: host.readiness(),
            tenants: host.tenantsServed().map((name) => [name, host.readiness(new URLSearchParams({ tenant: name }))]),
          };
        case 'reload':
          await host.reload();
          return { type: 'reply', id: m.id };
      }
    };
    reply().then(send, (err: Error) => send({ type: 'reply', id: m.id, error: err.message }));
  });
  process.once('disconnect', primaryGone);
  send({ type: 'ready' });
  reportAgents(host);
}
