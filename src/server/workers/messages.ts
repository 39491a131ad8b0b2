/** What the primary and its workers say to each other over the IPC channel (docs/multi-tenant.md, "Workers"). */
import type { Readiness } from '../../common/health-server.js';

/** Primary -> worker. A 'connection' carries the socket as the message's handle. */
export type ToWorker =
  | { type: 'connection'; port: 'agent' | 'frontend'; head: string }
  /** One cluster: a connection of the plain listener `index` (ServerOptions.frontend.extra, in its order), nothing read. */
  | { type: 'connection'; port: 'extra'; index: number }
  /** A connection on the Unix socket of `tenant`, a tenant shared by several workers whose socket the primary binds, nothing read. */
  | { type: 'connection'; port: 'tenant-uds'; tenant: string }
  | { type: 'request'; id: number; what: 'metrics' | 'readiness' | 'reload' };

/** Worker -> primary. */
export type ToPrimary =
  | { type: 'ready' }
  /** The agents the worker holds, in all and per tenant, sent when that changes (cluster-steering.ts sends frontends where they are). */
  | { type: 'agents'; count: number; tenants: [string, number][] }
  | {
      type: 'reply';
      id: number;
      metrics?: string[];
      readiness?: Readiness;
      /** With readiness: each tenant of the worker's own, as `/readyz?tenant=NAME` answers there. */
      tenants?: [string, Readiness][];
      error?: string;
    };

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null;
}

function asReadiness(v: unknown): Readiness | undefined {
  return isObject(v) ? { ready: v.ready === true, detail: String(v.detail) } : undefined;
}

function asTenants(v: unknown): [string, Readiness][] | undefined {
  if (!Array.isArray(v)) return undefined;
  const out: [string, Readiness][] = [];
  for (const e of v as unknown[]) {
    if (!Array.isArray(e) || typeof e[0] !== 'string') continue;
    const r = asReadiness(e[1]);
    if (r) out.push([e[0], r]);
  }
  return out;
}

function asCounts(v: unknown): [string, number][] {
  if (!Array.isArray(v)) return [];
  return (v as unknown[]).filter((e): e is [string, number] => Array.isArray(e) && typeof e[0] === 'string' && typeof e[1] === 'number');
}

/** A message from the primary, checked (it is our own process, but a bug should not become a crash). */
export function asToWorker(v: unknown): ToWorker | undefined {
  if (!isObject(v)) return undefined;
  if (v.type === 'connection' && (v.port === 'agent' || v.port === 'frontend') && typeof v.head === 'string')
    return { type: 'connection', port: v.port, head: v.head };
  if (v.type === 'connection' && v.port === 'extra' && Number.isInteger(v.index) && typeof v.index === 'number' && v.index >= 0)
    return { type: 'connection', port: 'extra', index: v.index };
  if (v.type === 'connection' && v.port === 'tenant-uds' && typeof v.tenant === 'string')
    return { type: 'connection', port: 'tenant-uds', tenant: v.tenant };
  if (v.type === 'request' && typeof v.id === 'number' && (v.what === 'metrics' || v.what === 'readiness' || v.what === 'reload'))
    return { type: 'request', id: v.id, what: v.what };
  return undefined;
}

export function asToPrimary(v: unknown): ToPrimary | undefined {
  if (!isObject(v)) return undefined;
  if (v.type === 'ready') return { type: 'ready' };
  if (v.type === 'agents' && typeof v.count === 'number') return { type: 'agents', count: v.count, tenants: asCounts(v.tenants) };
  if (v.type === 'reply' && typeof v.id === 'number') {
    const readiness = asReadiness(v.readiness);
    const tenants = asTenants(v.tenants);
    return {
      type: 'reply',
      id: v.id,
      ...(Array.isArray(v.metrics) ? { metrics: (v.metrics as unknown[]).filter((m): m is string => typeof m === 'string') } : {}),
      ...(readiness ? { readiness } : {}),
      ...(tenants ? { tenants } : {}),
      ...(typeof v.error === 'string' ? { error: v.error } : {}),
    };
  }
  return undefined;
}
