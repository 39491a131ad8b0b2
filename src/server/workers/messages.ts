/** What the primary and its workers say to each other over the IPC channel (docs/multi-tenant.md, "Workers"). */
import type { Readiness } from '../../common/health-server.js';

/** Primary -> worker. A 'connection' carries the socket as the message's handle. */
export type ToWorker =
  | { type: 'connection'; port: 'agent' | 'frontend'; head: string }
  | { type: 'request'; id: number; what: 'metrics' | 'readiness' | 'reload' };

/** Worker -> primary. */
export type ToPrimary = { type: 'ready' } | { type: 'reply'; id: number; metrics?: string[]; readiness?: Readiness; error?: string };

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null;
}

/** A message from the primary, checked (it is our own process, but a bug should not become a crash). */
export function asToWorker(v: unknown): ToWorker | undefined {
  if (!isObject(v)) return undefined;
  if (v.type === 'connection' && (v.port === 'agent' || v.port === 'frontend') && typeof v.head === 'string')
    return { type: 'connection', port: v.port, head: v.head };
  if (v.type === 'request' && typeof v.id === 'number' && (v.what === 'metrics' || v.what === 'readiness' || v.what === 'reload'))
    return { type: 'request', id: v.id, what: v.what };
  return undefined;
}

export function asToPrimary(v: unknown): ToPrimary | undefined {
  if (!isObject(v)) return undefined;
  if (v.type === 'ready') return { type: 'ready' };
  if (v.type === 'reply' && typeof v.id === 'number') {
    const readiness = isObject(v.readiness) ? { ready: v.readiness.ready === true, detail: String(v.readiness.detail) } : undefined;
    return {
      type: 'reply',
      id: v.id,
      ...(Array.isArray(v.metrics) ? { metrics: (v.metrics as unknown[]).filter((m): m is string => typeof m === 'string') } : {}),
      ...(readiness ? { readiness } : {}),
      ...(typeof v.error === 'string' ? { error: v.error } : {}),
    };
  }
  return undefined;
}
