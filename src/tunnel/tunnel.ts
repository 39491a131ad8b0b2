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
import {
  PacketType,
  type Packet,
  type ResolveRequestPacket,
  type ResolveResponsePacket,
  type ResumeEndPacket,
  type ResumePacket,
  type WindowPacket,
} from '../wire/packet.js';
import { Feature, type FeatureSet } from '../wire/features.js';
import { TunnelConnection, type ConnectionHost, type ConnectionRole } from './connection.js';
import type { ResolvedName, ResolveOptions } from './name-resolution.js';
import { DialError, TunnelClosedError } from './errors.js';
import type { DialHandler, DialOptions } from './dial-handler.js';
import type { TunnelEvents, TunnelOptions, TunnelSnapshot, TunnelStats } from './tunnel-options.js';
import { RecentEvents } from '../domain/recent-events.js';
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
import { ResumeExchange } from './resume-exchange.js';
import { LingeringConnections } from './lingering-connections.js';
import { DialAllowance } from './dial-allowance.js';
import { describeState, StateMachine, type Lifecycle } from '../common/state-machine.js';
import { ipLiteral, ResolveRequests } from './resolve-requests.js';
import { ResolveAnswers } from './resolve-answers.js';

export type { DialHandler, DialOptions, InboundDial } from './dial-handler.js';
export type { TunnelEvents, TunnelOptions, TunnelSnapshot, TunnelStats } from './tunnel-options.js';

/** Stream endings that mean the peer sent something it must not. */
const PEER_FAULTS = new Set([GrpcStatus.RESOURCE_EXHAUSTED, GrpcStatus.INTERNAL, GrpcStatus.INVALID_ARGUMENT, GrpcStatus.UNIMPLEMENTED]);

/**
 * Where a tunnel is in its life; changed only through Tunnel's `life` (TUNNEL).
 * - open: packets flow both ways. `writeBlocked`: the transport's send buffer
 *   is full, so bulk DATA waits for its 'drain' (replies and control packets
 *   still go, bounded by maxQueuedBytes). `peerDraining`: the peer sent DRAIN,
 *   "prefer other tunnels for new dials"; it still serves the ones it gets, as
 *   upstream's agent does (docs/protocol.md).
 * - detached (resume negotiated): the stream was lost while both sides live.
 *   Connections, dials and their bookkeeping stay, nothing is sent, local
 *   reads pause; reattach() puts a new stream under it (open again), or the
 *   resume timeout closes it.
 * - closing: close() is ending the stream. Nothing is sent; a 'close' the
 *   stream emits meanwhile is this side's decision, never a peer's fault.
 * - closed: the stream ended. Final.
 *
 * Invariants: open -> (detached -> open)* -> closing -> closed, or to closed
 * from open or detached, never back from closing or closed; `peerDraining`
 * never returns to false. While detached: no drain waiter, no peer-read
 * timer, every connection suspended, the resume timer set. Once closed: no
 * dial pending in either direction, no connection in the table or lingering,
 * no drain waiter, no timer. Open states are the four shared OPEN_STATES, so
 * blocking and unblocking on the data path allocate nothing.
 */
export type TunnelState =
  | { readonly kind: 'open'; readonly writeBlocked: boolean; readonly peerDraining: boolean }
  | { readonly kind: 'detached'; readonly peerDraining: boolean }
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

const DETACHED: readonly TunnelState[] = [
  { kind: 'detached', peerDraining: false },
  { kind: 'detached', peerDraining: true },
];
const CLOSING: TunnelState = { kind: 'closing' };
const NO_BYTES = new Uint8Array(0);
const CLOSED: TunnelState = { kind: 'closed' };

const draining = (t: TunnelState): boolean => (t.kind === 'open' || t.kind === 'detached') && t.peerDraining;

/** The arrows of TunnelState; any other move is a bug here, not the peer's, and throws. */
const TUNNEL: Lifecycle<TunnelState> = {
  name: 'tunnel',
  moves: { open: ['open', 'detached', 'closing', 'closed'], detached: ['open', 'closed'], closing: ['closed'], closed: [] },
  // A drain the peer asked for is kept until the end.
  allows: (from, to) => to.kind === 'closing' || to.kind === 'closed' || !draining(from) || draining(to),
  describe: (s) => {
    if (s.kind === 'open') return `open (writeBlocked ${s.writeBlocked}, peerDraining ${s.peerDraining})`;
    return s.kind === 'detached' ? `detached (peerDraining ${s.peerDraining})` : s.kind;
  },
};

export class Tunnel extends EventEmitter<TunnelEvents> implements ConnectionHost {
  readonly features: FeatureSet;
  readonly limits: TunnelLimits;
  readonly log: Logger;
  /** See TunnelState. */
  private readonly life: StateMachine<TunnelState>;

  /** Open connections: at most maxInboundConnections + maxOutboundConnections. */
  private readonly connections: ConnectionTable;
  /** Our dials awaiting DIAL_RSP: with the identity's other tunnels' (allowance), at most maxPendingDials, and counted in maxOutboundConnections. */
  private readonly outbound: OutboundDials;
  /** The peer's dials we are performing: with the identity's other tunnels' (allowance), at most maxPendingDials, and counted in maxInboundConnections. */
  private readonly inbound: InboundDials;
  /** The dial rates and counts this tunnel shares with the other tunnels of its identity (TunnelOptions.allowance). */
  readonly allowance: DialAllowance;
  /** Gives this tunnel's share of the allowance back; called once it is closed. */
  private readonly leaveAllowance: () => void;
  /** Names we asked the peer to resolve (at most MAX_PENDING_RESOLVES), and those it asked of us (at most MAX_CONCURRENT_RESOLVES). */
  private readonly resolves: ResolveRequests;
  private readonly answers: ResolveAnswers;
  /** Connections waiting for the transport to drain: at most one entry per connection. */
  private readonly drainWaiters = new DrainWaiters();
  private readonly isOpenNow = (): boolean => this.isOpen;
  private readonly writeBlockedNow = (): boolean => this.current.kind === 'open' && this.current.writeBlocked;
  private dialHandler: DialHandler | undefined;
  private readonly noise: RateLimitedLog;
  /** The stream under the tunnel now; another after each resume (bind()). */
  private currentStream!: PacketStream;
  private readPause!: ReadPause;
  /** Stops reading from, then closes, a peer that does not read what we send. */
  private peerReads!: PeerReadGuard;
  private readonly dispatch: PacketDispatch;
  /** Resume: set while detached, closes the tunnel when no stream comes back in time. */
  private resumeTimer: NodeJS.Timeout | undefined;
  /** Resume: when the stream was lost (performance.now()). */
  private detachedAt = 0;
  /** Resume: what both sides tell each other on a new stream, until the peer's list has ended. */
  private exchange: ResumeExchange | undefined;
  /** Resume: connections closed here whose last bytes or FIN the peer has not acknowledged. */
  private readonly lingering: LingeringConnections;
  /** DRAIN went to the peer: sent again on a resumed stream, in case it was lost with the old one. */
  private drainSent = false;
  private readonly reports: LimitReports;
  /** Bytes buffered for slow local readers of connections without flow control (limits.unflowedStreamBufferBytes). */
  private unflowedBytes = 0;
  /** Window growth its connections hold (limits.windowGrowthBudgetBytes). */
  readonly windowGrowth: WindowGrowthBudget;
  /** What the negotiated features make of every connection of this tunnel (flow control, half-close). */
  private readonly rules: ConnectionRules;
  /** When the tunnel was made (Date.now()): its first stream; a resume keeps it. */
  readonly createdAt = Date.now();
  /** Refusals and throttles of this tunnel in the last minutes, fed by its owner (the admin port's /status). */
  readonly recent = new RecentEvents();
  /** Bytes of the connections that have left the table, each way; open ones are added when read (snapshot()). */
  private closedBytesSent = 0;
  private closedBytesReceived = 0;

  constructor(
    stream: PacketStream,
    private readonly opts: TunnelOptions,
  ) {
    super();
    this.features = opts.features;
    this.limits = resolveLimits(opts.limits);
    this.windowGrowth = new WindowGrowthBudget(this.limits.windowGrowthBudgetBytes);
    this.rules = connectionRules(opts.features, this.limits);
    this.log = opts.log;
    this.life = new StateMachine<TunnelState>(OPEN_STATES[0], TUNNEL, this.log.isLevelEnabled('debug') ? this.traceMove : undefined);
    this.connections = new ConnectionTable(opts.side);
    this.dialHandler = opts.dialHandler;
    this.noise = new RateLimitedLog(this.log, 10_000);
    this.reports = new LimitReports({
      limits: this.limits,
      onLimit: opts.onLimit,
      limitFlags: opts.limitFlags,
      refusalReasons: opts.refusalReasons,
    });
    const send = (packet: Packet): void => this.send(packet);
    this.allowance = opts.allowance ?? new DialAllowance({ limits: this.limits });
    this.leaveAllowance = this.allowance.join(() => ({
      inboundPending: this.inbound.size,
      inboundConnections: this.connections.performerCount,
      outboundPending: this.outbound.size,
      outboundConnections: this.connections.dialerCount,
    }));
    this.outbound = new OutboundDials({
      log: this.log,
      send,
      reports: this.reports,
      allowance: this.allowance,
      openConnection: (connectID, dialID, address) =>
        this.connections.has(connectID) ? undefined : this.addConnection(connectID, dialID, address, 'dialer'),
    });
    this.lingering = new LingeringConnections(this.limits.windowGrowthBudgetBytes);
    this.inbound = new InboundDials({
      noise: this.noise,
      send,
      isAlive: () => this.current.kind === 'open' || this.current.kind === 'detached',
      handler: () => this.dialHandler,
      refuseDialsReason: opts.refuseDialsReason,
      reports: this.reports,
      allowance: this.allowance,
      onFailed: opts.onInboundDialFailed,
      openConnection: (dialID, address) => this.addConnection(this.connections.allocateConnectID(), dialID, address, 'performer'),
    });
    this.resolves = new ResolveRequests({ send });
    this.answers = new ResolveAnswers({ send, handler: opts.resolveHandler, noise: this.noise });
    this.dispatch = new PacketDispatch({
      side: opts.side,
      connections: this.connections,
      inbound: this.inbound,
      outbound: this.outbound,
      log: this.log,
      noise: this.noise,
      send,
      drainRequested: () => this.onDrainRequested(),
      resume: (p) => this.onResumePacket(p),
      resolvePacket: (p) => this.onResolvePacket(p),
      requestedAgain: (dialID) => this.exchange !== undefined && !this.exchange.finished && this.exchange.dialRequested(dialID),
      lingeringWindow: (p) => this.lingering.acknowledged(p),
    });
    this.bind(stream);
  }

  /** The stream under the tunnel now. */
  get stream(): PacketStream {
    return this.currentStream;
  }

  /** Puts `stream` under the tunnel: its packets, drain and close come here (a lost one's late events do not). */
  private bind(stream: PacketStream): void {
    this.currentStream = stream;
    this.readPause = new ReadPause(stream);
    this.peerReads = this.guardReads(stream);
    // DATA is a byte stream here: a packet may arrive in pieces, uncopied.
    stream.acceptDataInPieces?.();
    this.rules.configureStream(stream);
    stream.on('packet', (p) => {
      if (stream === this.currentStream) this.dispatch.packet(p);
    });
    stream.on('invalid', (reason) => this.noise.warn('invalid', { reason }, 'ignoring malformed packet from peer'));
    stream.on('drain', () => {
      if (stream === this.currentStream) this.onTransportDrain();
    });
    stream.on('close', (err) => {
      if (stream === this.currentStream) this.onStreamClose(err);
    });
  }

  private guardReads(stream: PacketStream): PeerReadGuard {
    return new PeerReadGuard({
      stream,
      limits: this.limits,
      readPause: this.readPause,
      reports: this.reports,
      log: this.log,
      noise: this.noise,
      isOpen: this.isOpenNow,
      close: (error) => this.close(error),
    });
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

  /** The stream was lost and the tunnel waits for a new one (resume); its connections are kept. */
  get detached(): boolean {
    return this.current.kind === 'detached';
  }

  /** True when this tunnel's connections outlive a lost stream (resume negotiated and a timeout set). */
  get resumable(): boolean {
    return this.rules.resume && (this.opts.resumeTimeoutMs ?? 0) > 0;
  }

  /** The peer sent DRAIN while the tunnel was open: it asks for no new dials, but still serves them. */
  get drainRequested(): boolean {
    const s = this.current;
    return (s.kind === 'open' || s.kind === 'detached') && s.peerDraining;
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
      detached: this.detached,
    };
  }

  /**
   * Where the tunnel is and what it carries, for the admin port's /status:
   * O(connections), read on request only. Connections by role: `dialer` ones
   * this side asked for, `performer` ones it dialled for the peer.
   */
  snapshot(): TunnelSnapshot {
    const s = this.current;
    let sent = this.closedBytesSent;
    let received = this.closedBytesReceived;
    for (const conn of this.connections.snapshot()) {
      sent += conn.bytesOut;
      received += conn.bytesIn;
    }
    return {
      state: s.kind,
      peerDraining: this.drainRequested,
      writeBlocked: s.kind === 'open' && s.writeBlocked,
      readPaused: this.readPaused,
      ...(s.kind === 'detached' ? { detachedForMs: Math.round(performance.now() - this.detachedAt) } : {}),
      connections: { dialer: this.connections.dialerCount, performer: this.connections.performerCount },
      pendingDials: { outbound: this.outbound.size, inbound: this.inbound.size },
      bytes: { sent, received },
    };
  }

  /** Bytes kept for a resume: sent by open or lingering connections and not acknowledged (O(connections): for metrics). */
  retainedBytes(): number {
    let n = this.lingering.bytes;
    for (const conn of this.connections.snapshot()) n += conn.unacknowledgedBytes;
    return n;
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

  /**
   * Resolves `name` on the far side of the tunnel, inside the cluster (an IP
   * literal here, at once); rejects with DialError 'unresolved' naming the
   * name and the resolver, 'exhausted' past MAX_PENDING_RESOLVES, 'cancelled', or 'tunnel-closed'.
   */
  resolve(name: string, opts: ResolveOptions): Promise<ResolvedName> {
    const literal = ipLiteral(name);
    if (literal !== undefined) return Promise.resolve({ addresses: [literal], resolver: 'IP literal' });
    if (!this.features.has(Feature.Resolve)) {
      const why = 'the agent does not resolve names (an upstream agent, or one older than the resolve feature): ask for an IP address';
      return Promise.reject(new DialError('unresolved', `cannot resolve ${name.slice(0, 253)}: ${why}`));
    }
    if (!this.isOpen) return Promise.reject(new DialError('tunnel-closed', `cannot resolve ${name.slice(0, 253)}: tunnel is closed`));
    return this.resolves.start(name, opts);
  }

  /** Asks the peer to prefer other tunnels for new dials (agent shutdown). */
  sendDrain(): void {
    this.drainSent = true;
    this.send({ type: PacketType.DRAIN });
  }

  /** Ends the stream gracefully; connections still open are closed. */
  close(error?: Error): void {
    if (this.current.kind === 'detached') {
      this.finish(error ?? new TunnelClosedError('tunnel closed locally'));
      return;
    }
    if (!this.isOpen) return;
    this.transition(CLOSING);
    if (error) this.stream.destroy(error);
    else this.stream.end();
    this.onStreamClose(error ?? new TunnelClosedError('tunnel closed locally'));
  }

  /**
   * Puts a new stream under a tunnel whose stream was lost (resume,
   * docs/protocol.md): both sides list what they hold and carry on. A
   * tunnel that still looks open (the peer found the loss first) drops its
   * old stream now. False (and the stream untouched) when the tunnel cannot resume.
   */
  reattach(stream: PacketStream): boolean {
    if (this.current.kind === 'open' && this.resumable) {
      const old = this.stream;
      this.detach(new TunnelClosedError('the peer resumed this tunnel on a new stream'));
      old.destroy(new GrpcStatusError(GrpcStatus.CANCELLED, 'replaced by a resumed stream'));
    }
    const s = this.current;
    if (s.kind !== 'detached') return false;
    clearTimeout(this.resumeTimer);
    this.bind(stream);
    this.transition(openState(false, s.peerDraining));
    const detachedMs = performance.now() - this.detachedAt;
    this.exchange = new ResumeExchange({
      connections: this.connections,
      inbound: this.inbound,
      outbound: this.outbound,
      lingering: this.lingering.byId,
      forgetLingering: (connectID) => this.lingering.drop(connectID),
      send: (packet) => this.send(packet),
      log: this.log,
      onReplayed: (bytes) => this.opts.onReplayed?.(bytes),
    });
    this.exchange.start();
    if (this.drainSent) this.send({ type: PacketType.DRAIN });
    // A peer that never ends its list would keep every connection suspended: bounded like the detachment.
    this.resumeTimer = setTimeout(() => {
      if (this.exchange && !this.exchange.finished) this.close(new TunnelClosedError('the peer did not finish resuming in time'));
    }, this.opts.resumeTimeoutMs ?? 0);
    this.resumeTimer.unref();
    this.emit('resumed', detachedMs);
    return true;
  }

  // ---------- ConnectionHost ----------

  sendData(connectID: number, data: Uint8Array): void {
    this.send({ type: PacketType.DATA, connectID, error: '', data });
  }

  sendWindow(connectID: number, increment: number, acknowledged?: number, finReceived?: boolean): void {
    const p: WindowPacket = { type: PacketType.KANAL_WINDOW, connectID, increment };
    if (acknowledged !== undefined) p.acknowledged = acknowledged;
    if (finReceived) p.finReceived = true;
    this.send(p);
  }

  sendHalfClose(connectID: number): void {
    this.send({ type: PacketType.KANAL_HALF_CLOSE, connectID });
  }

  sendClose(connectID: number, role: ConnectionRole, reason: string): void {
    // Upstream convention: the side that asked for the connection sends
    // CLOSE_REQ, the side that dialled reports a closed endpoint with CLOSE_RSP.
    // CLOSE_REQ carries no error: a Kanal peer learns of a failure from DATA{error}, which
    // closes the connection there with a reset (upstream's agent ignores that field, so it gets CLOSE_REQ).
    if (role === 'dialer' && reason && this.rules.halfClose) this.send({ type: PacketType.DATA, connectID, error: reason, data: NO_BYTES });
    else if (role === 'dialer') this.send({ type: PacketType.CLOSE_REQ, connectID });
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

  windowFault(connectID: number, fault: string): void {
    this.noise.warn('window-fault', { connectID, reason: fault }, 'closing a connection: the peer broke the window rules');
    this.opts.onPeerFault?.('window_beyond_maximum');
  }

  forget(connectID: number): void {
    const conn = this.connections.removeClosed(connectID);
    if (conn) {
      this.closedBytesSent += conn.bytesOut;
      this.closedBytesReceived += conn.bytesIn;
      if (conn.lingers && this.current.kind !== 'closed') this.lingering.add(conn);
      else if (conn.lingers) conn.releaseRetained();
      this.opts.onConnectionClosed?.(conn);
      // Per connection: no fields built unless they are logged.
      if (this.log.isLevelEnabled('debug'))
        this.log.debug(
          {
            connectID,
            dialID: String(conn.dialID),
            address: conn.address,
            bytesIn: conn.bytesIn,
            bytesOut: conn.bytesOut,
            reason: conn.closeReason,
          },
          'connection closed',
        );
    }
  }

  // ---------- state ----------

  private get current(): TunnelState {
    return this.life.state;
  }

  /** The one place the state changes: along the arrows of TunnelState (TUNNEL), else it throws. */
  private transition(next: TunnelState): void {
    this.life.to(next);
  }

  /** A debug line per move, but not per transport back-pressure flip (open to open, the data path's). */
  private readonly traceMove = (from: TunnelState, to: TunnelState): void => {
    if (from.kind !== to.kind || draining(from) !== draining(to))
      this.log.debug(`tunnel: ${describeState(TUNNEL, from)} -> ${describeState(TUNNEL, to)}`);
  };

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
    // Shed by the ledger: an open connection is closed, a lingering one forgets what it keeps.
    const account = this.opts.accounts?.openConnection((reason) => {
      if (conn.state !== 'closed') conn.close(new Error(`closed by this proxy: ${reason}`), 'proxy');
      else this.lingering.drop(connectID);
    });
    const conn: TunnelConnection = new TunnelConnection(this, {
      connectID,
      dialID,
      address,
      role,
      rules: this.rules,
      limits: this.limits,
      log: this.log,
      ...(account ? { account } : {}),
    });
    this.connections.add(conn);
    // Opened while the stream is lost (a dial that connected meanwhile): it waits with the others.
    if (this.current.kind === 'detached') conn.suspend();
    if (this.log.isLevelEnabled('debug')) this.log.debug({ connectID, dialID: String(dialID), address, role }, 'connection open');
    return conn;
  }

  private onStreamClose(error: Error | undefined): void {
    const kind = this.current.kind;
    if (kind === 'closed' || kind === 'detached') return;
    const closedLocally = kind === 'closing';
    const peerFault = error instanceof GrpcStatusError && PEER_FAULTS.has(error.code);
    if (!closedLocally && peerFault) {
      // The peer broke the protocol (oversized or compressed message, ...): say so.
      this.log.warn({ grpcStatus: GrpcStatus[error.code], reason: error.message }, 'stream closed: peer violated the protocol');
    }
    // A connection lost while both sides live (reset, PING timeout, a cut path: UNAVAILABLE) keeps its connections for a resume;
    // a clean end, or a stream the peer cancelled on purpose while its connection lives, does not.
    const lost = error !== undefined && (!(error instanceof GrpcStatusError) || error.code === GrpcStatus.UNAVAILABLE);
    if (!closedLocally && !peerFault && lost && this.resumable) {
      this.detach(error);
      return;
    }
    this.finish(error);
  }

  /** The stream is lost; the connections wait, suspended, for reattach() or the resume timeout. */
  private detach(error: Error): void {
    const s = this.current;
    if (s.kind !== 'open') return;
    this.transition(DETACHED[s.peerDraining ? 1 : 0]);
    this.detachedAt = performance.now();
    this.exchange = undefined;
    this.drainWaiters.clear();
    this.peerReads.stop();
    this.endResolves(`the tunnel's stream was lost (${error.message})`);
    for (const conn of this.connections.snapshot()) conn.suspend();
    clearTimeout(this.resumeTimer);
    const timeoutMs = this.opts.resumeTimeoutMs ?? 0;
    this.resumeTimer = setTimeout(() => {
      this.emit('resume-expired');
      this.finish(new TunnelClosedError(`not resumed within ${timeoutMs} ms (${error.message})`));
    }, timeoutMs);
    this.resumeTimer.unref();
    this.emit('detached', error);
  }

  /** To 'closed': every dial fails, every connection is abandoned (the owner is told why). */
  private finish(error: Error | undefined): void {
    if (this.current.kind === 'closed') return;
    this.transition(CLOSED);
    clearTimeout(this.resumeTimer);
    this.exchange = undefined;
    const reason = error ?? new TunnelClosedError('tunnel closed by peer');
    this.outbound.failAll(`tunnel closed: ${reason.message}`);
    this.inbound.abortAll();
    this.endResolves(`tunnel closed: ${reason.message}`);
    // Each abandoned connection leaves the table through forget().
    for (const conn of this.connections.snapshot()) conn.abandon(new TunnelClosedError(`tunnel closed: ${reason.message}`));
    this.lingering.clear();
    this.drainWaiters.clear();
    this.peerReads.stop();
    this.leaveAllowance();
    this.emit('close', error);
  }

  /** The resolve packets: only with the feature negotiated (a peer that sends them otherwise breaks the protocol; ignored). */
  private onResolvePacket(p: ResolveRequestPacket | ResolveResponsePacket): void {
    if (!this.features.has(Feature.Resolve)) {
      this.noise.warn('resolve-unexpected', { packet: PacketType[p.type] }, 'ignoring a resolve packet: the feature was not negotiated');
      return;
    }
    if (p.type === PacketType.KANAL_RESOLVE_REQ) this.answers.requested(p);
    else this.resolves.answered(p);
  }

  /** The stream went: resolves pending either way end (no replay on a resume: see resolve-requests.ts). */
  private endResolves(why: string): void {
    this.resolves.failAll('tunnel-closed', why);
    this.answers.abortAll();
  }

  /** KANAL_RESUME and KANAL_RESUME_END: only meaningful on a stream that replaced a lost one. */
  private onResumePacket(p: ResumePacket | ResumeEndPacket): void {
    const exchange = this.exchange;
    if (!exchange || exchange.finished) {
      this.noise.warn('resume-unexpected', { packet: PacketType[p.type] }, 'ignoring a resume packet outside a resume');
      return;
    }
    if (p.type === PacketType.KANAL_RESUME) exchange.entry(p);
    else {
      exchange.end();
      clearTimeout(this.resumeTimer);
    }
  }
}
