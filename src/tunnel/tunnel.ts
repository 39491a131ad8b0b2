/**
 * The multiplexer shared by server and agent: one PacketStream carrying many
 * TCP connections in both directions. Either side may dial (DIAL_REQ) and
 * either side may perform dials, so the agent's CP->node connections and
 * the server's node->CP connections live in one table; each side assigns
 * connectIDs of its own parity (agent odd, server even) so they never meet.
 */
import { EventEmitter } from 'node:events';
import type { Duplex } from 'node:stream';
import type { Logger } from 'pino';
import type { PacketStream } from '../transport/packet-stream.js';
import { PacketType, type Packet } from '../wire/packet.js';
import type { FeatureSet } from '../wire/features.js';
import { TunnelConnection, type ConnectionHost, type ConnectionRole } from './connection.js';
import { DialError, TunnelClosedError } from './errors.js';
import { resolveLimits, type TunnelLimitName, type TunnelLimits } from './limits.js';
import { ReadPause } from './read-pause.js';
import { WindowGrowthBudget } from './receive-window.js';
import { connectionRules, type ConnectionRules } from './connection-rules.js';
import { randomDialID } from './dial-id.js';
import { splice } from './splice.js';
import { RateLimitedLog } from '../common/rate-limited-log.js';
import { RecentIds } from './recent-ids.js';
import { GrpcStatus, GrpcStatusError } from '../transport/grpc-status.js';
import { Cancel, type CancelSignal } from '../common/cancel.js';

/** Stream endings that mean the peer sent something it must not. */
const PEER_FAULTS = new Set([GrpcStatus.RESOURCE_EXHAUSTED, GrpcStatus.INTERNAL, GrpcStatus.INVALID_ARGUMENT, GrpcStatus.UNIMPLEMENTED]);

/** A dial the peer asked us to perform. */
export interface InboundDial {
  protocol: string;
  address: string;
  dialID: bigint;
  /** Aborted when the peer cancels (DIAL_CLS) or the tunnel closes. */
  signal: CancelSignal;
}

/** Performs a dial for the peer and returns the connected socket (or, relaying, a connection of another tunnel), or throws DialError/Error. */
export type DialHandler = (dial: InboundDial) => Promise<Duplex | TunnelConnection>;

export interface TunnelOptions {
  /** 'agent' assigns odd connectIDs, 'server' even ones. */
  side: 'agent' | 'server';
  features: FeatureSet;
  log: Logger;
  limits?: Partial<TunnelLimits>;
  /** Performs dials requested by the peer; absent means every DIAL_REQ is refused. */
  dialHandler?: DialHandler;
  /** Text of the refusal when there is no dial handler. */
  refuseDialsReason?: string;
  /** Called once per connection when it leaves the table (for metrics). */
  onConnectionClosed?: (conn: TunnelConnection) => void;
  /** Called each time a limit refuses a dial, pauses reading or closes the stream (for metrics). */
  onLimit?: (limit: TunnelLimitName) => void;
  /** The flag that sets each limit, named in log lines so an operator knows what to raise. */
  limitFlags?: Partial<Record<TunnelLimitName, string>>;
}

export interface DialOptions {
  timeoutMs: number;
  signal?: CancelSignal;
  protocol?: string;
}

export interface TunnelStats {
  connections: number;
  pendingDials: number;
  inboundDials: number;
  /** Window growth its connections hold now (see TunnelLimits.windowGrowthBudgetBytes). */
  windowGrowthBytes: number;
  /** True while the tunnel does not read its stream (a slow local reader, or a peer that does not read). */
  readPaused: boolean;
}

interface PendingDial {
  address: string;
  resolve(conn: TunnelConnection): void;
  reject(err: Error): void;
  cleanup(): void;
}

export interface TunnelEvents {
  'drain-requested': [];
  close: [error: Error | undefined];
}

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
  private readonly connections = new Map<number, TunnelConnection>();
  /** Our dials awaiting DIAL_RSP: at most maxPendingDials, and counted in maxOutboundConnections. */
  private readonly pendingDials = new Map<bigint, PendingDial>();
  /** The peer's dials we are performing: at most maxPendingDials, and counted in maxInboundConnections. */
  private readonly inboundDials = new Map<bigint, Cancel>();
  /** Open connections by role (dialer: we asked for it; performer: the peer did). */
  private dialerConnections = 0;
  private performerConnections = 0;
  private nextConnectID: number;
  /** Connections waiting for the transport to drain: at most one entry per connection. */
  private drainWaiters = new Set<() => void>();
  private dialHandler: DialHandler | undefined;
  private readonly noise: RateLimitedLog;
  private readonly readPause: ReadPause;
  /** Closes the stream when the peer leaves our packets unread too long (limits.peerReadTimeoutMs). */
  private peerReadTimer: NodeJS.Timeout | undefined;
  /** Bytes buffered for slow local readers of connections without flow control (limits.unflowedStreamBufferBytes). */
  private unflowedBytes = 0;
  /** connectIDs recently closed or answered as unknown: late packets for them are dropped quietly. */
  private readonly recentlyGone = new RecentIds(1024);
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
    this.nextConnectID = opts.side === 'agent' ? 1 : 2;
    this.dialHandler = opts.dialHandler;
    this.noise = new RateLimitedLog(this.log, 10_000);
    this.readPause = new ReadPause(stream);
    // DATA is a byte stream here: a packet may arrive in pieces, uncopied.
    stream.acceptDataInPieces?.();
    this.rules.configureStream(stream);
    stream.on('packet', (p) => this.onPacket(p));
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
    return this.connections.size + this.pendingDials.size;
  }

  stats(): TunnelStats {
    return {
      connections: this.connections.size,
      pendingDials: this.pendingDials.size,
      inboundDials: this.inboundDials.size,
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
    const refusal =
      this.overLimit('maxPendingDials', this.pendingDials.size, 'dials waiting for an answer') ??
      this.overLimit(
        'maxOutboundConnections',
        this.pendingDials.size + this.dialerConnections,
        'connections open or being dialled through this tunnel',
      );
    if (refusal) return Promise.reject(new DialError('exhausted', refusal));
    if (opts.signal?.aborted) return Promise.reject(new DialError('cancelled', 'dial cancelled'));
    let dialID = randomDialID();
    while (this.pendingDials.has(dialID)) dialID = randomDialID();
    return new Promise<TunnelConnection>((resolve, reject) => {
      const cancel = (failure: 'timeout' | 'cancelled', message: string): void => {
        if (!this.pendingDials.has(dialID)) return;
        this.pendingDials.get(dialID)?.cleanup();
        this.pendingDials.delete(dialID);
        this.send({ type: PacketType.DIAL_CLS, random: dialID });
        this.log.debug({ dialID: String(dialID), address }, `dial ${failure}`);
        reject(new DialError(failure, message));
      };
      const timer = setTimeout(() => cancel('timeout', `dial to ${address} timed out after ${opts.timeoutMs} ms`), opts.timeoutMs);
      const onAbort = (): void => cancel('cancelled', 'dial cancelled by requester');
      opts.signal?.addEventListener('abort', onAbort);
      this.pendingDials.set(dialID, {
        address,
        resolve,
        reject,
        cleanup: () => {
          clearTimeout(timer);
          opts.signal?.removeEventListener('abort', onAbort);
        },
      });
      this.send({ type: PacketType.DIAL_REQ, protocol: opts.protocol ?? 'tcp', address, random: dialID });
    });
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
    else if (this.readPause.hold(connectID)) this.opts.onLimit?.('unflowedBufferBytes');
  }

  noteUnflowedBytes(delta: number): void {
    this.unflowedBytes += delta;
    const limit = this.limits.unflowedStreamBufferBytes;
    if (this.unflowedBytes >= limit) {
      if (this.readPause.hold('unflowed-stream')) this.opts.onLimit?.('unflowedStreamBufferBytes');
    } else if (this.unflowedBytes < limit / 2) {
      this.readPause.release('unflowed-stream');
    }
  }

  whenWritable(resume: () => void): void {
    if (!this.isOpen) return;
    this.drainWaiters.add(resume);
  }

  forget(connectID: number): void {
    const conn = this.connections.get(connectID);
    if (conn && conn.state === 'closed') {
      this.connections.delete(connectID);
      if (conn.role === 'dialer') this.dialerConnections--;
      else this.performerConnections--;
      this.recentlyGone.add(connectID);
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
      this.boundSendQueue();
    }
  }

  /**
   * Past the transport's send buffer only replies and control packets are
   * sent (bulk DATA waits for 'drain'). A peer that makes us answer and does
   * not read the answers is not read from either, and loses its stream
   * if that does not stop it. No deadlock between two Kanal peers: each
   * reads all the time, so neither queue reaches this point first.
   */
  private boundSendQueue(): void {
    const queued = this.stream.queuedBytes;
    if (queued > this.limits.maxQueuedBytes) {
      this.closeStalledPeer('maxQueuedBytes', `${queued} bytes queued for it, limit ${this.limits.maxQueuedBytes}`);
      return;
    }
    if (queued < this.limits.pauseReadingQueuedBytes || !this.readPause.hold('peer-not-reading')) return;
    this.opts.onLimit?.('pauseReadingQueuedBytes');
    this.noise.warn(
      'peer-not-reading',
      { queuedBytes: queued, ...this.flagOf('pauseReadingQueuedBytes') },
      'peer does not read what we send: stopped reading from it until it does',
    );
    const timeout = this.limits.peerReadTimeoutMs;
    this.peerReadTimer = setTimeout(
      () => this.closeStalledPeer('peerReadTimeoutMs', `it left ${this.stream.queuedBytes} bytes unread for ${timeout} ms`),
      timeout,
    );
    this.peerReadTimer.unref();
  }

  private closeStalledPeer(limit: TunnelLimitName, why: string): void {
    if (!this.isOpen) return;
    this.opts.onLimit?.(limit);
    this.log.warn({ peer: this.stream.peer, ...this.flagOf(limit) }, `closing stream: the peer does not read (${why})`);
    this.close(new GrpcStatusError(GrpcStatus.RESOURCE_EXHAUSTED, `peer does not read its stream: ${why}`));
  }

  /** `{ flag }` naming the setting of `limit`, for log lines. */
  private flagOf(limit: TunnelLimitName): { flag?: string } {
    const flag = this.opts.limitFlags?.[limit];
    return flag ? { flag } : {};
  }

  /** The refusal text when `count` has reached `limit` (which is then reported), or undefined. */
  private overLimit(limit: TunnelLimitName, count: number, what: string): string | undefined {
    const max = this.limits[limit];
    if (count < max) return undefined;
    this.opts.onLimit?.(limit);
    const { flag } = this.flagOf(limit);
    return `too many ${what}: ${count}, limit ${max}${flag ? ` (${flag})` : ''}`;
  }

  private onTransportDrain(): void {
    // Closing or closed: the waiters are (about to be) dropped with the connections.
    if (!this.isOpen) return;
    this.setWriteBlocked(false);
    if (this.readPause.has('peer-not-reading')) {
      clearTimeout(this.peerReadTimer);
      this.readPause.release('peer-not-reading');
    }
    const waiters = [...this.drainWaiters];
    this.drainWaiters = new Set();
    for (let i = 0; i < waiters.length; i++) {
      waiters[i]();
      const s = this.current;
      // Closed by what the waiter did: its close dropped the rest.
      if (s.kind !== 'open') return;
      if (s.writeBlocked) {
        // Round robin: whoever did not get a turn goes first next time, ahead
        // of the ones that just sent and queued again (else one bulk sender
        // that refills the transport on every drain starves the rest).
        const again = this.drainWaiters;
        this.drainWaiters = new Set(waiters.slice(i + 1));
        for (const w of again) this.drainWaiters.add(w);
        return;
      }
    }
  }

  private onPacket(p: Packet): void {
    switch (p.type) {
      case PacketType.DATA: {
        const conn = this.connections.get(p.connectID);
        if (!conn) return this.unknownConnection(p.connectID, 'DATA');
        if (p.error) conn.receiveClose(p.error);
        else conn.receiveData(p.data);
        return;
      }
      case PacketType.KANAL_WINDOW:
        // A window for a connection that just closed is normal; ignore it.
        this.connections.get(p.connectID)?.receiveWindow(p.increment);
        return;
      case PacketType.KANAL_HALF_CLOSE: {
        const conn = this.connections.get(p.connectID);
        if (!conn) return this.unknownConnection(p.connectID, 'KANAL_HALF_CLOSE');
        conn.receiveHalfClose();
        return;
      }
      case PacketType.DIAL_REQ:
        return this.onDialRequest(p.protocol, p.address, p.random);
      case PacketType.DIAL_RSP:
        return this.onDialResponse(p.random, p.connectID, p.error);
      case PacketType.CLOSE_REQ: {
        const conn = this.connections.get(p.connectID);
        if (conn) {
          conn.receiveClose('');
          this.send({ type: PacketType.CLOSE_RSP, connectID: p.connectID, error: '' });
        } else {
          this.send({ type: PacketType.CLOSE_RSP, connectID: p.connectID, error: 'unknown connectID' });
        }
        return;
      }
      case PacketType.CLOSE_RSP:
        // Unsolicited (the far endpoint closed) or the answer to our CLOSE_REQ.
        this.connections.get(p.connectID)?.receiveClose(p.error === 'unknown connectID' ? '' : p.error);
        return;
      case PacketType.DIAL_CLS:
        return this.onCloseDial(p.random);
      case PacketType.DRAIN: {
        const s = this.current;
        if (s.kind === 'open' && !s.peerDraining) {
          this.transition(openState(s.writeBlocked, true));
          this.log.info('peer requested drain');
          this.emit('drain-requested');
        }
        return;
      }
    }
  }

  private unknownConnection(connectID: number, what: string): void {
    // Answer each unknown connectID once: a peer still streaming DATA into a
    // connection that just closed must not get one close packet per DATA.
    if (this.recentlyGone.has(connectID)) return;
    this.recentlyGone.add(connectID);
    this.noise.warn('unknown-connect-id', { connectID, packet: what }, 'packet for unknown connectID; telling the peer to close it');
    if (this.opts.side === 'server') this.send({ type: PacketType.CLOSE_REQ, connectID });
    else this.send({ type: PacketType.CLOSE_RSP, connectID, error: 'unknown connectID' });
  }

  private onDialResponse(dialID: bigint, connectID: number, error: string): void {
    const pending = this.pendingDials.get(dialID);
    if (!pending) {
      if (!error && connectID !== 0) {
        // The dial was cancelled meanwhile: close what the peer opened.
        this.log.debug({ dialID: String(dialID), connectID }, 'DIAL_RSP for a cancelled dial; closing it');
        this.send({ type: PacketType.CLOSE_REQ, connectID });
      }
      return;
    }
    this.pendingDials.delete(dialID);
    pending.cleanup();
    if (error) {
      pending.reject(new DialError('refused', error));
      return;
    }
    if (connectID === 0 || this.connections.has(connectID)) {
      this.log.error({ dialID: String(dialID), connectID }, 'peer answered a dial with an unusable connectID');
      pending.reject(new DialError('refused', `peer assigned unusable connectID ${connectID}`));
      return;
    }
    pending.resolve(this.addConnection(connectID, dialID, pending.address, 'dialer'));
  }

  private onDialRequest(protocol: string, address: string, dialID: bigint): void {
    const refuse = (error: string): void => {
      this.noise.warn('dial-refused', { dialID: String(dialID), address, reason: error }, 'refusing dial request');
      this.send({ type: PacketType.DIAL_RSP, random: dialID, connectID: 0, error });
    };
    const handler = this.dialHandler;
    if (!handler) return refuse(this.opts.refuseDialsReason ?? 'this side does not accept dial requests');
    if (protocol !== 'tcp') return refuse(`unsupported protocol ${JSON.stringify(protocol)}`);
    if (this.inboundDials.has(dialID)) return refuse('duplicate dial ID');
    const refusal =
      this.overLimit('maxPendingDials', this.inboundDials.size, 'dials waiting for an answer') ??
      this.overLimit(
        'maxInboundConnections',
        this.inboundDials.size + this.performerConnections,
        'connections open or being dialled for the peer',
      );
    if (refusal) return refuse(refusal);
    const abort = new Cancel();
    this.inboundDials.set(dialID, abort);
    handler({ protocol, address, dialID, signal: abort }).then(
      (endpoint) => {
        this.inboundDials.delete(dialID);
        if (abort.aborted || !this.isOpen) {
          if (endpoint instanceof TunnelConnection) endpoint.close();
          else endpoint.destroy();
          return;
        }
        const connectID = this.allocateConnectID();
        const conn = this.addConnection(connectID, dialID, address, 'performer');
        this.send({ type: PacketType.DIAL_RSP, random: dialID, connectID, error: '' });
        splice(endpoint, conn);
      },
      (err: Error) => {
        this.inboundDials.delete(dialID);
        if (abort.aborted || !this.isOpen) return;
        this.noise.info('dial-failed', { dialID: String(dialID), address, err: err.message }, 'dial failed');
        this.send({ type: PacketType.DIAL_RSP, random: dialID, connectID: 0, error: err.message });
      },
    );
  }

  private onCloseDial(dialID: bigint): void {
    const inbound = this.inboundDials.get(dialID);
    if (inbound) {
      this.inboundDials.delete(dialID);
      inbound.abort();
      this.log.debug({ dialID: String(dialID) }, 'peer cancelled its dial');
      return;
    }
    const pending = this.pendingDials.get(dialID);
    if (pending) {
      this.pendingDials.delete(dialID);
      pending.cleanup();
      pending.reject(new DialError('refused', 'dial closed by peer'));
    }
  }

  private allocateConnectID(): number {
    let id = this.nextConnectID;
    while (this.connections.has(id)) id += 2;
    this.nextConnectID = id + 2;
    return id;
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
    this.connections.set(connectID, conn);
    if (role === 'dialer') this.dialerConnections++;
    else this.performerConnections++;
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
    for (const [id, pending] of this.pendingDials) {
      this.pendingDials.delete(id);
      pending.cleanup();
      pending.reject(new DialError('tunnel-closed', `tunnel closed: ${reason.message}`));
    }
    for (const [id, abort] of this.inboundDials) {
      this.inboundDials.delete(id);
      abort.abort();
    }
    // Each abandoned connection leaves the table through forget().
    for (const conn of [...this.connections.values()]) conn.abandon(new TunnelClosedError(`tunnel closed: ${reason.message}`));
    this.drainWaiters.clear();
    clearTimeout(this.peerReadTimer);
    this.emit('close', error);
  }
}

function describeState(s: TunnelState): string {
  return s.kind === 'open' ? `open (writeBlocked ${s.writeBlocked}, peerDraining ${s.peerDraining})` : s.kind;
}
