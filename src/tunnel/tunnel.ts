/**
 * The multiplexer shared by server and agent: one PacketStream carrying many
 * TCP connections in both directions. Either side may dial (DIAL_REQ) and
 * either side may perform dials, so the agent's CP->node connections and
 * the server's node->CP connections live in one table; each side assigns
 * connectIDs of its own parity (agent odd, server even) so they never meet.
 */
import { EventEmitter } from 'node:events';
import type { Logger } from 'pino';
import type { PacketStream } from '../transport/packet-stream.js';
import { PacketType, type Packet } from '../wire/packet.js';
import type { FeatureSet } from '../wire/features.js';
import { TunnelConnection, type ConnectionHost, type ConnectionRole } from './connection.js';
import { DialError, TunnelClosedError } from './errors.js';
import type { DialHandler, DialOptions } from './dial-handler.js';
import type { TunnelEvents, TunnelOptions, TunnelStats } from './tunnel-options.js';
import { LimitReports } from './limit-reports.js';
import { PeerReadGuard } from './peer-read-guard.js';
import { PacketDispatch } from './packet-dispatch.js';
import { OutboundDials } from './outbound-dials.js';
import { InboundDials } from './inbound-dials.js';
import { ConnectionTable } from './connection-table.js';
import { DrainWaiters } from './drain-waiters.js';
import { resolveLimits, type TunnelLimits } from './limits.js';
import { ReadPause } from './read-pause.js';
import { WindowGrowthBudget } from './receive-window.js';
import { connectionRules, type ConnectionRules } from './connection-rules.js';
import { RateLimitedLog } from '../common/rate-limited-log.js';
import { GrpcStatus, GrpcStatusError } from '../transport/grpc-status.js';

export type { DialHandler, DialOptions, InboundDial } from './dial-handler.js';
export type { TunnelEvents, TunnelOptions, TunnelStats } from './tunnel-options.js';

/** Stream endings that mean the peer sent something it must not. */
const PEER_FAULTS = new Set([GrpcStatus.RESOURCE_EXHAUSTED, GrpcStatus.INTERNAL, GrpcStatus.INVALID_ARGUMENT, GrpcStatus.UNIMPLEMENTED]);

/**
 * Where a tunnel is in its life; changed only by Tunnel.transition().
 * - open: packets flow both ways. `writeBlocked`: the transport's send buffer
 *   is full, so bulk DATA waits for its 'drain' (replies and control packets
 *   still go, bounded by maxQueuedBytes). `peerDraining`: the peer sent DRAIN,
 *   "prefer other tunnels for new dials"; it still serves the ones it gets, as
 *   upstream's agent does (docs/protocol.md).
 * - closing: close() is ending the stream. Nothing is sent; a 'close' the
 *   stream emits meanwhile is this side's decision, never a peer's fault.
 * - closed: the stream ended. Final.
 *
 * Invariants: open -> closing -> closed or open -> closed, never back;
 * `peerDraining` never returns to false. Once closed: no dial pending in
 * either direction, no connection in the table, no drain waiter, no
 * peer-read timer. Open states are the four shared OPEN_STATES, so blocking
 * and unblocking on the data path allocate nothing.
 */
export type TunnelState =
  | { readonly kind: 'open'; readonly writeBlocked: boolean; readonly peerDraining: boolean }
  | { readonly kind: 'closing' }
  | { readonly kind: 'closed' };

type OpenState = Extract<TunnelState, { kind: 'open' }>;

/** Indexed by writeBlocked + 2 * peerDraining. */
const OPEN_STATES: readonly OpenState[] = [
  { kind: 'open', writeBlocked: false, peerDraining: false },
  { kind: 'open', writeBlocked: true, peerDraining: false },
  { kind: 'open', writeBlocked: false, peerDraining: true },
  { kind: 'open', writeBlocked: true, peerDraining: true },
];

function openState(writeBlocked: boolean, peerDraining: boolean): OpenState {
  return OPEN_STATES[(writeBlocked ? 1 : 0) + (peerDraining ? 2 : 0)];
}

const CLOSING: TunnelState = { kind: 'closing' };
const CLOSED: TunnelState = { kind: 'closed' };

export class Tunnel extends EventEmitter<TunnelEvents> implements ConnectionHost {
  readonly features: FeatureSet;
  readonly limits: TunnelLimits;
  readonly log: Logger;
  /** See TunnelState; changed only by transition(). */
  private current: TunnelState = OPEN_STATES[0];

  /** Open connections: at most maxInboundConnections + maxOutboundConnections. */
  private readonly connections: ConnectionTable;
  /** Our dials awaiting DIAL_RSP: at most maxPendingDials, and counted in maxOutboundConnections. */
  private readonly outbound: OutboundDials;
  /** The peer's dials we are performing: at most maxPendingDials, and counted in maxInboundConnections. */
  private readonly inbound: InboundDials;
  /** Connections waiting for the transport to drain: at most one entry per connection. */
  private readonly drainWaiters = new DrainWaiters();
  private readonly isOpenNow = (): boolean => this.isOpen;
  private readonly writeBlockedNow = (): boolean => this.current.kind === 'open' && this.current.writeBlocked;
  private dialHandler: DialHandler | undefined;
  private readonly noise: RateLimitedLog;
  private readonly readPause: ReadPause;
  /** Stops reading from, then closes, a peer that does not read what we send. */
  private readonly peerReads: PeerReadGuard;
  private readonly reports: LimitReports;
  /** Bytes buffered for slow local readers of connections without flow control (limits.unflowedStreamBufferBytes). */
  private unflowedBytes = 0;
  /** Window growth its connections hold (limits.windowGrowthBudgetBytes). */
  readonly windowGrowth: WindowGrowthBudget;
  /** What the negotiated features make of every connection of this tunnel (flow control, half-close). */
  private readonly rules: ConnectionRules;

  constructor(
    readonly stream: PacketStream,
    private readonly opts: TunnelOptions,
  ) {
    super();
    this.features = opts.features;
    this.limits = resolveLimits(opts.limits);
    this.windowGrowth = new WindowGrowthBudget(this.limits.windowGrowthBudgetBytes);
    this.rules = connectionRules(opts.features, this.limits);
    this.log = opts.log;
    this.connections = new ConnectionTable(opts.side);
    this.dialHandler = opts.dialHandler;
    this.noise = new RateLimitedLog(this.log, 10_000);
    this.reports = new LimitReports({ limits: this.limits, onLimit: opts.onLimit, limitFlags: opts.limitFlags });
    const send = (packet: Packet): void => this.send(packet);
    this.outbound = new OutboundDials({
      log: this.log,
      send,
      reports: this.reports,
      dialerConnections: () => this.connections.dialerCount,
      openConnection: (connectID, dialID, address) =>
        this.connections.has(connectID) ? undefined : this.addConnection(connectID, dialID, address, 'dialer'),
    });
    this.inbound = new InboundDials({
      noise: this.noise,
      send,
      isOpen: this.isOpenNow,
      handler: () => this.dialHandler,
      refuseDialsReason: opts.refuseDialsReason,
      reports: this.reports,
      performerConnections: () => this.connections.performerCount,
      openConnection: (dialID, address) => this.addConnection(this.connections.allocateConnectID(), dialID, address, 'performer'),
    });
    this.readPause = new ReadPause(stream);
    this.peerReads = new PeerReadGuard({
      stream,
      limits: this.limits,
      readPause: this.readPause,
      reports: this.reports,
      log: this.log,
      noise: this.noise,
      isOpen: this.isOpenNow,
      close: (error) => this.close(error),
    });
    // DATA is a byte stream here: a packet may arrive in pieces, uncopied.
    stream.acceptDataInPieces?.();
    this.rules.configureStream(stream);
    const dispatch = new PacketDispatch({
      side: opts.side,
      connections: this.connections,
      inbound: this.inbound,
      outbound: this.outbound,
      log: this.log,
      noise: this.noise,
      send,
      drainRequested: () => this.onDrainRequested(),
    });
    stream.on('packet', (p) => dispatch.packet(p));
    stream.on('invalid', (reason) => this.noise.warn('invalid', { reason }, 'ignoring malformed packet from peer'));
    stream.on('drain', () => this.onTransportDrain());
    stream.on('close', (err) => this.onStreamClose(err));
  }

  // ---------- state, read-only ----------

  /** Open: dials may start and packets flow (neither closing nor closed). */
  get isOpen(): boolean {
    return this.current.kind === 'open';
  }

  /** The stream has ended and everything of the tunnel is released. */
  get closed(): boolean {
    return this.current.kind === 'closed';
  }

  /** The peer sent DRAIN while the tunnel was open: it asks for no new dials, but still serves them. */
  get drainRequested(): boolean {
    const s = this.current;
    return s.kind === 'open' && s.peerDraining;
  }

  /** Open and the transport takes more bulk data now (the data path asks this per packet). */
  get writable(): boolean {
    const s = this.current;
    return s.kind === 'open' && !s.writeBlocked;
  }

  /**
   * Open, the peer has not asked to drain, and the tunnel reads its stream (a
   * slow local reader with an upstream peer, or a peer that does not read,
   * pauses it, and a DIAL_RSP would wait behind that): routing's first choice
   * for a new dial (src/server/routing/router.ts).
   */
  get preferredForDials(): boolean {
    const s = this.current;
    return s.kind === 'open' && !s.peerDraining && !this.readPaused;
  }

  /** True while the tunnel does not read its stream: a DIAL_RSP would wait too. */
  get readPaused(): boolean {
    return this.readPause.paused;
  }

  setDialHandler(handler: DialHandler | undefined): void {
    this.dialHandler = handler;
  }

  /** Open connections plus dials awaiting an answer: what routing balances (src/server/routing/router.ts). */
  get load(): number {
    return this.connections.size + this.outbound.size;
  }

  stats(): TunnelStats {
    return {
      connections: this.connections.size,
      pendingDials: this.outbound.size,
      inboundDials: this.inbound.size,
      windowGrowthBytes: this.windowGrowth.held,
      readPaused: this.readPaused,
    };
  }

  /** The open connection with `connectID`, if any (diagnostics, tests). */
  connection(connectID: number): TunnelConnection | undefined {
    return this.connections.get(connectID);
  }

  /** Opens a connection to `address` on the far side of the tunnel; join it to a socket with splice(), or read it as a ConnectionStream. */
  dial(address: string, opts: DialOptions): Promise<TunnelConnection> {
    if (!this.isOpen) return Promise.reject(new DialError('tunnel-closed', 'tunnel is closed'));
    return this.outbound.start(address, opts);
  }

  /** Asks the peer to prefer other tunnels for new dials (agent shutdown). */
  sendDrain(): void {
    this.send({ type: PacketType.DRAIN });
  }

  /** Ends the stream gracefully; connections still open are closed. */
  close(error?: Error): void {
    if (!this.isOpen) return;
    this.transition(CLOSING);
    if (error) this.stream.destroy(error);
    else this.stream.end();
    this.onStreamClose(error ?? new TunnelClosedError('tunnel closed locally'));
  }

  // ---------- ConnectionHost ----------

  sendData(connectID: number, data: Uint8Array): void {
    this.send({ type: PacketType.DATA, connectID, error: '', data });
  }

  sendWindow(connectID: number, increment: number): void {
    this.send({ type: PacketType.KANAL_WINDOW, connectID, increment });
  }

  sendHalfClose(connectID: number): void {
    this.send({ type: PacketType.KANAL_HALF_CLOSE, connectID });
  }

  sendClose(connectID: number, role: ConnectionRole, reason: string): void {
    // Upstream convention: the side that asked for the connection sends
    // CLOSE_REQ, the side that dialled reports a closed endpoint with CLOSE_RSP.
    if (role === 'dialer') this.send({ type: PacketType.CLOSE_REQ, connectID });
    else this.send({ type: PacketType.CLOSE_RSP, connectID, error: reason });
  }

  holdInbound(connectID: number, hold: boolean): void {
    if (!hold) this.readPause.release(connectID);
    else if (this.readPause.hold(connectID)) this.reports.reached('unflowedBufferBytes');
  }

  noteUnflowedBytes(delta: number): void {
    this.unflowedBytes += delta;
    const limit = this.limits.unflowedStreamBufferBytes;
    if (this.unflowedBytes >= limit) {
      if (this.readPause.hold('unflowed-stream')) this.reports.reached('unflowedStreamBufferBytes');
    } else if (this.unflowedBytes < limit / 2) {
      this.readPause.release('unflowed-stream');
    }
  }

  whenWritable(resume: () => void): void {
    if (!this.isOpen) return;
    this.drainWaiters.add(resume);
  }

  forget(connectID: number): void {
    const conn = this.connections.removeClosed(connectID);
    if (conn) {
      this.opts.onConnectionClosed?.(conn);
      // Per connection: no fields built unless they are logged.
      if (this.log.isLevelEnabled('debug'))
        this.log.debug(
          { connectID, dialID: String(conn.dialID), address: conn.address, bytesIn: conn.bytesIn, bytesOut: conn.bytesOut },
          'connection closed',
        );
    }
  }

  // ---------- state ----------

  /** The one place the state changes: along the arrows of TunnelState, else it throws (a bug here, not the peer's). */
  private transition(next: TunnelState): void {
    const from = this.current;
    const allowed =
      from.kind === 'open'
        ? next.kind !== 'open' || !from.peerDraining || next.peerDraining
        : from.kind === 'closing' && next.kind === 'closed';
    if (!allowed) throw new Error(`tunnel: no transition from ${describeState(from)} to ${describeState(next)}`);
    this.current = next;
  }

  /** The transport took (true) or refused (false) more bulk data; nothing changes unless open. */
  private setWriteBlocked(blocked: boolean): void {
    const s = this.current;
    if (s.kind === 'open' && s.writeBlocked !== blocked) this.transition(openState(blocked, s.peerDraining));
  }

  // ---------- packets to and from the peer ----------

  private send(packet: Packet): void {
    if (!this.isOpen) return;
    if (!this.stream.send(packet)) {
      // The stream may have closed while taking the packet: then there is nothing to bound.
      if (!this.isOpen) return;
      this.setWriteBlocked(true);
      this.peerReads.sendRefused();
    }
  }

  private onTransportDrain(): void {
    // Closing or closed: the waiters are (about to be) dropped with the connections.
    if (!this.isOpen) return;
    this.setWriteBlocked(false);
    this.peerReads.drained();
    this.drainWaiters.resume(this.isOpenNow, this.writeBlockedNow);
  }

  /** DRAIN from the peer: it asks for no new dials (once; it never takes that back). */
  private onDrainRequested(): void {
    const s = this.current;
    if (s.kind === 'open' && !s.peerDraining) {
      this.transition(openState(s.writeBlocked, true));
      this.log.info('peer requested drain');
      this.emit('drain-requested');
    }
  }

  private addConnection(connectID: number, dialID: bigint, address: string, role: ConnectionRole): TunnelConnection {
    const conn = new TunnelConnection(this, {
      connectID,
      dialID,
      address,
      role,
      rules: this.rules,
      limits: this.limits,
      log: this.log,
    });
    this.connections.add(conn);
    if (this.log.isLevelEnabled('debug')) this.log.debug({ connectID, dialID: String(dialID), address, role }, 'connection open');
    return conn;
  }

  private onStreamClose(error: Error | undefined): void {
    if (this.current.kind === 'closed') return;
    const closedLocally = this.current.kind === 'closing';
    this.transition(CLOSED);
    const reason = error ?? new TunnelClosedError('tunnel closed by peer');
    if (!closedLocally && error instanceof GrpcStatusError && PEER_FAULTS.has(error.code)) {
      // The peer broke the protocol (oversized or compressed message, ...): say so.
      this.log.warn({ grpcStatus: GrpcStatus[error.code], reason: error.message }, 'stream closed: peer violated the protocol');
    }
    this.outbound.failAll(`tunnel closed: ${reason.message}`);
    this.inbound.abortAll();
    // Each abandoned connection leaves the table through forget().
    for (const conn of this.connections.snapshot()) conn.abandon(new TunnelClosedError(`tunnel closed: ${reason.message}`));
    this.drainWaiters.clear();
    this.peerReads.stop();
    this.emit('close', error);
  }
}

function describeState(s: TunnelState): string {
  return s.kind === 'open' ? `open (writeBlocked ${s.writeBlocked}, peerDraining ${s.peerDraining})` : s.kind;
}
