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
import { Feature, type FeatureSet } from '../wire/features.js';
import { TunnelConnection, type ConnectionHost, type ConnectionRole } from './connection.js';
import { DialError, TunnelClosedError } from './errors.js';
import { resolveLimits, type TunnelLimits } from './limits.js';
import { randomDialID } from './dial-id.js';
import { splice } from './splice.js';
import { RateLimitedLog } from '../common/rate-limited-log.js';
import { RecentIds } from './recent-ids.js';
import { GrpcStatus, GrpcStatusError } from '../transport/transport.js';

/** Stream endings that mean the peer sent something it must not. */
const PEER_FAULTS = new Set([GrpcStatus.RESOURCE_EXHAUSTED, GrpcStatus.INTERNAL, GrpcStatus.INVALID_ARGUMENT, GrpcStatus.UNIMPLEMENTED]);

/** A dial the peer asked us to perform. */
export interface InboundDial {
  protocol: string;
  address: string;
  dialID: bigint;
  /** Aborted when the peer cancels (DIAL_CLS) or the tunnel closes. */
  signal: AbortSignal;
}

/** Performs a dial for the peer and returns the connected stream, or throws DialError/Error. */
export type DialHandler = (dial: InboundDial) => Promise<Duplex>;

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
  /**
   * For a stream without the window feature that carries one connection at a
   * time (gRPC frontend): pause the stream for a slow reader instead of
   * closing the connection when its buffer overflows.
   */
  holdStreamWhenSlow?: boolean;
  /** Called once per connection when it leaves the table (for metrics). */
  onConnectionClosed?: (conn: TunnelConnection) => void;
}

export interface DialOptions {
  timeoutMs: number;
  signal?: AbortSignal;
  protocol?: string;
}

export interface TunnelStats {
  connections: number;
  pendingDials: number;
  inboundDials: number;
  /** Window growth its connections hold now (see TunnelLimits.windowGrowthBudgetBytes). */
  windowGrowthBytes: number;
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

export class Tunnel extends EventEmitter<TunnelEvents> implements ConnectionHost {
  readonly features: FeatureSet;
  readonly limits: TunnelLimits;
  readonly log: Logger;
  closed = false;
  /** Set once the peer sent DRAIN. */
  drainRequested = false;

  private readonly connections = new Map<number, TunnelConnection>();
  private readonly pendingDials = new Map<bigint, PendingDial>();
  private readonly inboundDials = new Map<bigint, AbortController>();
  private nextConnectID: number;
  private writeBlocked = false;
  private drainWaiters = new Set<() => void>();
  private dialHandler: DialHandler | undefined;
  private readonly noise: RateLimitedLog;
  /** Connections holding the stream paused (slow readers, no flow control). */
  private readonly holders = new Set<number>();
  /** connectIDs recently closed or answered as unknown: late packets for them are dropped quietly. */
  private readonly recentlyGone = new RecentIds(1024);
  private windowGrowth = 0;

  constructor(
    readonly stream: PacketStream,
    private readonly opts: TunnelOptions,
  ) {
    super();
    this.features = opts.features;
    this.limits = resolveLimits(opts.limits);
    this.log = opts.log;
    this.nextConnectID = opts.side === 'agent' ? 1 : 2;
    this.dialHandler = opts.dialHandler;
    this.noise = new RateLimitedLog(this.log, 10_000);
    // DATA is a byte stream here: a packet may arrive in pieces, uncopied.
    stream.acceptDataInPieces?.();
    stream.on('packet', (p) => this.onPacket(p));
    stream.on('invalid', (reason) => this.noise.warn('invalid', { reason }, 'ignoring malformed packet from peer'));
    stream.on('drain', () => this.onTransportDrain());
    stream.on('close', (err) => this.onStreamClose(err));
  }

  get writable(): boolean {
    return !this.writeBlocked && !this.closed;
  }

  setDialHandler(handler: DialHandler | undefined): void {
    this.dialHandler = handler;
  }

  stats(): TunnelStats {
    return { connections: this.connections.size, pendingDials: this.pendingDials.size, inboundDials: this.inboundDials.size, windowGrowthBytes: this.windowGrowth };
  }

  /** Opens a connection to `address` on the far side of the tunnel. */
  dial(address: string, opts: DialOptions): Promise<TunnelConnection> {
    if (this.closed) return Promise.reject(new DialError('tunnel-closed', 'tunnel is closed'));
    if (this.pendingDials.size >= this.limits.maxPendingDials) {
      return Promise.reject(new DialError('exhausted', `too many pending dials (${this.pendingDials.size})`));
    }
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
      opts.signal?.addEventListener('abort', onAbort, { once: true });
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
    if (this.closed) return;
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

  reserveWindowGrowth(bytes: number): boolean {
    if (this.windowGrowth + bytes > this.limits.windowGrowthBudgetBytes) return false;
    this.windowGrowth += bytes;
    return true;
  }

  releaseWindowGrowth(bytes: number): void {
    this.windowGrowth -= bytes;
  }

  holdInbound(connectID: number, hold: boolean): void {
    const before = this.holders.size;
    if (hold) this.holders.add(connectID);
    else this.holders.delete(connectID);
    if (before === 0 && this.holders.size > 0) this.stream.pause();
    else if (before > 0 && this.holders.size === 0) this.stream.resume();
  }

  whenWritable(resume: () => void): void {
    if (this.closed) return;
    this.drainWaiters.add(resume);
  }

  forget(connectID: number): void {
    const conn = this.connections.get(connectID);
    if (conn && conn.destroyed) {
      this.connections.delete(connectID);
      this.recentlyGone.add(connectID);
      this.opts.onConnectionClosed?.(conn);
      this.log.debug({ connectID, dialID: String(conn.dialID), address: conn.address, bytesIn: conn.bytesIn, bytesOut: conn.bytesOut }, 'connection closed');
    }
  }

  // ---------- packets from the peer ----------

  private send(packet: Packet): void {
    if (this.closed) return;
    if (!this.stream.send(packet)) this.writeBlocked = true;
  }

  private onTransportDrain(): void {
    this.writeBlocked = false;
    const waiters = [...this.drainWaiters];
    this.drainWaiters = new Set();
    for (let i = 0; i < waiters.length; i++) {
      waiters[i]!();
      if (this.writeBlocked) {
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
      case PacketType.DRAIN:
        if (!this.drainRequested) {
          this.drainRequested = true;
          this.log.info('peer requested drain');
          this.emit('drain-requested');
        }
        return;
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
    if (this.inboundDials.size >= this.limits.maxPendingDials) return refuse('too many pending dials');
    const abort = new AbortController();
    this.inboundDials.set(dialID, abort);
    handler({ protocol, address, dialID, signal: abort.signal }).then(
      (endpoint) => {
        this.inboundDials.delete(dialID);
        if (abort.signal.aborted || this.closed) {
          endpoint.destroy();
          return;
        }
        const connectID = this.allocateConnectID();
        const conn = this.addConnection(connectID, dialID, address, 'performer');
        this.send({ type: PacketType.DIAL_RSP, random: dialID, connectID, error: '' });
        splice(endpoint, conn);
      },
      (err: Error) => {
        this.inboundDials.delete(dialID);
        if (abort.signal.aborted || this.closed) return;
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
      flowControl: this.features.has(Feature.Window),
      halfClose: this.features.has(Feature.HalfClose),
      holdStreamWhenSlow: this.opts.holdStreamWhenSlow ?? false,
      limits: this.limits,
      log: this.log,
    });
    this.connections.set(connectID, conn);
    this.log.debug({ connectID, dialID: String(dialID), address, role }, 'connection open');
    return conn;
  }

  private onStreamClose(error: Error | undefined): void {
    if (this.closed) return;
    this.closed = true;
    const reason = error ?? new TunnelClosedError('tunnel closed by peer');
    if (error instanceof GrpcStatusError && PEER_FAULTS.has(error.code)) {
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
    this.emit('close', error);
  }
}
