/**
 * The audit log's records, one JSON line each (docs/operations.md, "The
 * audit log: what a line says"). `auditVersion` changes only when a field
 * changes meaning or goes away; new fields may appear within a version.
 */
import type { ClientIdentity } from '../tunnel/connection.js';
import type { DialResult } from '../domain/dial-result.js';
import type { RefusalReason } from '../domain/refusal-reason.js';
import type { Direction } from '../domain/metrics.js';

export const AUDIT_VERSION = 1;

/** Who ended a connection, from the connection's ends rather than from the proxy's sides. */
export type ClosedBy = 'client' | 'destination' | 'proxy' | 'tunnel';

/** The agent a tunnelled connection or dial went through: as it authenticated (server), or itself (agent). */
export interface AuditAgent {
  id: string;
  /** The certificate subject or service account that authenticated it (the server's view only). */
  credential?: string;
}

/** The server at the other end of an agent's tunnel (the agent's view). */
export interface AuditServer {
  id: string;
  /** The address the agent dialled it at. */
  address?: string;
}

interface RecordBase {
  /** The schema's version; also what tells an audit line from a log line when both go to stdout. */
  auditVersion: typeof AUDIT_VERSION;
  /** When the line was written: the connection's end, the dial's failure, the refusal. RFC 3339, UTC. */
  time: string;
  side: 'server' | 'agent';
  tenant?: string;
}

/** A tunnelled connection, established and now ended. */
export interface ConnectionRecord extends RecordBase {
  event: 'connection';
  /** The dial's ID (DIAL_REQ's random; logs' dialID): the same in the server's and the agent's line. */
  dialID: string;
  /** The tunnel's ID of the connection (upstream's connectID), also the same on both sides. */
  connectID: number;
  direction: Direction;
  agent: AuditAgent;
  server?: AuditServer;
  client?: ClientIdentity;
  destination: string;
  dial: { result: 'ok'; ms: number };
  /** Bytes the client sent toward the destination, and the destination's answer. */
  bytes: { toDestination: number; toClient: number };
  /** From the dial's answer to the close. */
  durationMs: number;
  closedBy: ClosedBy;
  /** "finished" (both sides done), "closed" (one side closed it), or what failed. */
  reason: string;
}

/** A dial that made no connection: refused (by a limit or a rule: `refusal`), failed, timed out or cancelled. */
export interface DialRecord extends RecordBase {
  event: 'dial';
  /** Absent when it was refused before a DIAL_REQ was sent. */
  dialID?: string;
  direction: Direction;
  agent?: AuditAgent;
  server?: AuditServer;
  client?: ClientIdentity;
  destination: string;
  dial: { result: Exclude<DialResult, 'ok'>; ms: number; error: string };
  refusal?: RefusalReason;
  /** `direct`: a dial the server made itself, on a direct route (no agent). */
  via?: 'direct';
}

/**
 * A connection the server dialled itself, on one of the tenant's direct
 * routes (docs/frontends.md, "Direct routes"), established and now ended: no
 * agent, no tunnel, so no dialID or connectID.
 */
export interface DirectRecord extends RecordBase {
  event: 'direct';
  client?: ClientIdentity;
  destination: string;
  dial: { result: 'ok'; ms: number };
  bytes: { toDestination: number; toClient: number };
  durationMs: number;
  closedBy: Exclude<ClosedBy, 'tunnel'>;
  reason: string;
}

/** A peer refused before any dial: an agent that did not authenticate, a frontend request that was not one. */
export interface RefusalRecord extends RecordBase {
  event: 'refused';
  refusal: RefusalReason;
  /** "host:port", or "unix:path". */
  peer: string;
  agent?: AuditAgent;
  message: string;
  detail?: string;
}

export type AuditRecord = ConnectionRecord | DirectRecord | DialRecord | RefusalRecord;

/** Where records go (the audit log's writer); absent: no audit log. */
export interface AuditSink {
  write(record: AuditRecord): void;
}
