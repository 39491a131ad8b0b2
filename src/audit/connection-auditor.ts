/**
 * Turns what the tunnels and dialers know into audit records
 * (audit-record.ts): one per tunnelled connection as it ends, one per dial
 * that made none, one per refused peer. Also writes the info line each
 * ended connection gets in the log, with the same fields, so an operator
 * without an audit log still sees who reached what (docs/operations.md).
 * Strings a peer chose (addresses, error texts) are cut to MAX_LOG_STRING.
 */
import type { Logger } from 'pino';
import { truncateForLog } from '../common/log-safety.js';
import { FixedLogLine, isoNow, logNumber, logString } from '../common/fixed-log-line.js';
import type { Direction } from '../domain/metrics.js';
import type { PeerRefusal } from '../domain/refusal-log.js';
import type { RefusalReason } from '../domain/refusal-reason.js';
import type { DialResult } from '../domain/dial-result.js';
import { DialError } from '../tunnel/errors.js';
import type { ClientIdentity, ConnectionEnder, ConnectionRole, TunnelConnection } from '../tunnel/connection.js';
import type { InboundDialFailure } from '../tunnel/tunnel-options.js';
import {
  AUDIT_VERSION,
  type DirectRecord,
  type AuditAgent,
  type AuditServer,
  type AuditSink,
  type ClosedBy,
  type DialRecord,
} from './audit-record.js';

/** Whose tunnel a connection or dial went through: the agent (server side) or the server (agent side). */
export interface TunnelParty {
  agent: AuditAgent;
  server?: AuditServer;
}

/** A dial that made no connection, as the side that asked for it or performed it knows it. */
export interface FailedDial {
  direction: Direction;
  party?: TunnelParty;
  client?: ClientIdentity;
  destination: string;
  error: unknown;
  /** performance.now() when the dial started. */
  startedAt: number;
  /** Set when a limit or rule of this proxy refused it (else taken from a DialError's). */
  refusal?: RefusalReason;
  /** What became of it, when `error` is no DialError that says. */
  result?: Exclude<DialResult, 'ok'>;
  /** A dial the server made itself, on a direct route. */
  via?: 'direct';
}

/** A connection the server dialled itself on a direct route, as it ended (clients/direct-dials.ts). */
export interface DirectConnection {
  client: ClientIdentity;
  destination: string;
  dialMs: number;
  toDestination: number;
  toClient: number;
  durationMs: number;
  closedBy: 'client' | 'destination' | 'proxy';
  reason: string;
}

export interface ConnectionAuditorOptions {
  side: 'server' | 'agent';
  log: Logger;
  /** The audit log; absent: only the log line per ended connection. */
  sink?: AuditSink;
  tenant?: string;
}

/** Milliseconds, to the tenth. */
function ms(value: number): number {
  return Math.round(value * 10) / 10;
}

/** The connection's ends: the dialer's local end is the client, the performer's the destination (docs/operations.md). */
function closedBy(role: ConnectionRole, by: ConnectionEnder | undefined): ClosedBy {
  if (by === 'local') return role === 'dialer' ? 'client' : 'destination';
  if (by === 'peer') return role === 'dialer' ? 'destination' : 'client';
  return by ?? 'proxy';
}

/** The direction of a connection by this side's role in it. */
export function directionOf(side: 'server' | 'agent', role: ConnectionRole): Direction {
  return (side === 'server') === (role === 'dialer') ? 'cp_to_node' : 'node_to_cp';
}

export class ConnectionAuditor {
  private readonly log: Logger;
  /** The `connection ended` line written by hand (fixed-log-line.ts); undefined: through pino. */
  private readonly endedLine: FixedLogLine | undefined;

  constructor(private readonly opts: ConnectionAuditorOptions) {
    this.log = opts.log;
    this.endedLine = FixedLogLine.info(opts.log, 'connection ended');
  }

  /**
   * A connection left its tunnel's table: its log line (flat: the logger
   * walks every nested object again) and its record, from the same values,
   * each computed once. Every key of the record is always set (undefined ones
   * are left out of the JSON), so each object has one shape: this runs once
   * per connection.
   */
  connectionEnded(conn: TunnelConnection, party: TunnelParty): void {
    const { sink, side, tenant } = this.opts;
    const logged = this.log.isLevelEnabled('info');
    if (!sink && !logged) return;
    const dialer = conn.role === 'dialer';
    const dialID = String(conn.dialID);
    const direction = directionOf(side, conn.role);
    const destination = truncateForLog(conn.address);
    const dialMs = ms(conn.dialMs);
    const toDestination = dialer ? conn.bytesOut : conn.bytesIn;
    const toClient = dialer ? conn.bytesIn : conn.bytesOut;
    const durationMs = Date.now() - conn.openedAt;
    const ender = closedBy(conn.role, conn.endedBy);
    const reason = truncateForLog(conn.closeReason);
    const time = isoNow();
    if (logged && this.endedLine)
      // The fields and their order of the object below; strings bounded as the logger bounds them.
      this.endedLine.write(
        `,"dialID":"${dialID}"${logNumber('connectID', conn.connectID)},"direction":"${direction}"` +
          logString('agentID', party.agent.id) +
          logString('credential', party.agent.credential) +
          logString('serverID', party.server?.id) +
          logString('client', conn.client?.address) +
          logString('destination', destination) +
          logNumber('dialMs', dialMs) +
          logNumber('toDestination', toDestination) +
          logNumber('toClient', toClient) +
          logNumber('durationMs', durationMs) +
          `,"closedBy":"${ender}"` +
          logString('reason', reason),
        time,
      );
    else if (logged)
      this.log.info(
        {
          dialID,
          connectID: conn.connectID,
          direction,
          agentID: party.agent.id,
          credential: party.agent.credential,
          serverID: party.server?.id,
          client: conn.client?.address,
          destination,
          dialMs,
          toDestination,
          toClient,
          durationMs,
          closedBy: ender,
          reason,
        },
        'connection ended',
      );
    sink?.write({
      auditVersion: AUDIT_VERSION,
      time,
      side,
      tenant,
      event: 'connection',
      dialID,
      connectID: conn.connectID,
      direction,
      agent: party.agent,
      server: party.server,
      client: conn.client,
      destination,
      dial: { result: 'ok', ms: dialMs },
      bytes: { toDestination, toClient },
      durationMs,
      closedBy: ender,
      reason,
    });
  }

  /** A dial the peer asked this side to perform made no connection (TunnelOptions.onInboundDialFailed). */
  inboundDialFailed(role: ConnectionRole, party: TunnelParty, f: InboundDialFailure): void {
    this.dialFailed(
      {
        direction: directionOf(this.opts.side, role),
        party,
        destination: f.address,
        error: f.error,
        result: f.result,
        startedAt: performance.now() - f.ms,
        ...(f.reason ? { refusal: f.reason } : {}),
      },
      f.dialID,
    );
  }

  /** A dial made no connection. `dialID`: when a DIAL_REQ carried it (else a DialError's). */
  dialFailed(d: FailedDial, dialID?: bigint): void {
    const { sink } = this.opts;
    if (!sink) return;
    const err = d.error instanceof DialError ? d.error : undefined;
    const id = dialID ?? err?.dialID;
    const refusal = d.refusal ?? err?.refusal;
    const record: DialRecord = {
      auditVersion: AUDIT_VERSION,
      time: new Date().toISOString(),
      side: this.opts.side,
      ...(this.opts.tenant === undefined ? {} : { tenant: this.opts.tenant }),
      event: 'dial',
      ...(id === undefined ? {} : { dialID: String(id) }),
      direction: d.direction,
      ...(d.party ? { agent: d.party.agent } : {}),
      ...(d.party?.server ? { server: d.party.server } : {}),
      ...(d.client ? { client: d.client } : {}),
      destination: truncateForLog(d.destination),
      dial: {
        result: d.result ?? err?.failure ?? 'refused',
        ms: ms(performance.now() - d.startedAt),
        error: truncateForLog(d.error instanceof Error ? d.error.message : String(d.error)),
      },
      ...(refusal ? { refusal } : {}),
      ...(d.via ? { via: d.via } : {}),
    };
    sink.write(record);
  }

  /**
   * A peer refused before any dial (Refusals.refuse). A refusal made before
   * a tenant's room (the server's listeners) names the tenant the peer was
   * recognised as or named, when there is one, in its `tenant` field.
   */
  refused(r: PeerRefusal, agent?: AuditAgent): void {
    const tenant = this.opts.tenant ?? (typeof r.fields.tenant === 'string' ? r.fields.tenant : undefined);
    this.opts.sink?.write({
      auditVersion: AUDIT_VERSION,
      time: new Date().toISOString(),
      side: this.opts.side,
      ...(tenant === undefined ? {} : { tenant }),
      event: 'refused',
      refusal: r.reason,
      peer: truncateForLog(r.peer),
      ...(agent ? { agent } : {}),
      message: r.message,
      ...(r.detail ? { detail: truncateForLog(r.detail) } : {}),
    });
  }

  /** A connection on a direct route ended: its log line and its record, as connectionEnded's for a tunnelled one. */
  directEnded(c: DirectConnection): void {
    const { sink, side, tenant } = this.opts;
    const destination = truncateForLog(c.destination);
    const reason = truncateForLog(c.reason);
    const dialMs = ms(c.dialMs);
    if (this.log.isLevelEnabled('info'))
      this.log.info(
        {
          via: 'direct',
          client: c.client.address,
          destination,
          dialMs,
          toDestination: c.toDestination,
          toClient: c.toClient,
          durationMs: c.durationMs,
          closedBy: c.closedBy,
          reason,
        },
        'connection ended',
      );
    if (!sink) return;
    const record: DirectRecord = {
      auditVersion: AUDIT_VERSION,
      time: new Date().toISOString(),
      side,
      ...(tenant === undefined ? {} : { tenant }),
      event: 'direct',
      client: c.client,
      destination,
      dial: { result: 'ok', ms: dialMs },
      bytes: { toDestination: c.toDestination, toClient: c.toClient },
      durationMs: c.durationMs,
      closedBy: c.closedBy,
      reason,
    };
    sink.write(record);
  }
}
