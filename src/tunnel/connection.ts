/**
 * One tunnelled TCP connection, joined to its local end (a socket, or in a
 * relay the partner connection; splice.ts): the peer's DATA goes to the local
 * end, the local end's bytes go out as DATA. Each connection bounds what it
 * buffers. With the window extension the peer stops sending when our window
 * is spent, so a slow local reader never stalls its neighbours. Without it
 * (upstream peers) a full buffer pauses the whole stream, as upstream does,
 * and a slow reader never loses data.
 *
 * Its parts: ConnectionSendQueue (our bytes, the peer's credit), an InboundFlow (the
 * peer's bytes, by the tunnel's ConnectionRules), the local end, and the
 * state below.
 */
import type { Logger } from 'pino';
import type { TunnelLimits } from './limits.js';
import { noteBytesMoved } from './gc-pacer.js';
import { ConnectionSendQueue, type SendHost } from './connection-send-queue.js';
import type { ConnectionRules, InboundFlow, InboundFlowHost } from './connection-rules.js';
import { EarlyEnd, type LocalClose, type LocalEnd } from './local-end.js';
import { PacketType, type ResumePacket } from '../wire/packet.js';
import type { HeldBytes } from '../domain/retention-ledger.js';
import { debugTrace, StateMachine, type Lifecycle } from '../common/state-machine.js';

/** How long a connection whose local end went away may make no progress sending what that end left before it is dropped. */
export const FLUSH_IDLE_MS = 10_000;

/** What a connection needs from its tunnel. */
export interface ConnectionHost extends SendHost, InboundFlowHost {
  sendHalfClose(connectID: number): void;
  /** Tells the peer the connection is gone (CLOSE_REQ or CLOSE_RSP by role). */
  sendClose(connectID: number, role: ConnectionRole, reason: string): void;
  /** The connection closed: it leaves the tunnel's table. */
  forget(connectID: number): void;
  /** The peer broke the window rules (credit or a resume limit beyond the protocol's largest window): counted. */
  windowFault(connectID: number, fault: string): void;
}

/** Whether we asked for this connection (dialer) or performed the dial (performer). */
export type ConnectionRole = 'dialer' | 'performer';

/**
 * Who ended a connection (the audit log's closedBy, docs/operations.md): this
 * side's local end, the peer (for its local end), this proxy (a fault or a
 * stall it cut), or the tunnel (lost, or closed under the connection).
 */
export type ConnectionEnder = 'local' | 'peer' | 'proxy' | 'tunnel';

/** Who asked for a connection, as the frontend or node listener that accepted it knows them (audit log). */
export interface ClientIdentity {
  /** "host:port", or "unix:path" for a Unix socket. */
  address: string;
  /** The client certificate's subject (mTLS). */
  subject?: string;
  /** A Unix socket peer's credentials (SO_PEERCRED, unix(7)). */
  uid?: number;
  pid?: number;
  /** The frontend client's name once admitted (its `clients:` entry, or kube-apiserver): audit records carry it. */
  name?: string;
}

/**
 * The connection as the tunnel and its tests see it, read from the states
 * below: 'open', bytes flow both ways; 'local-ended', our FIN went out
 * (KANAL_HALF_CLOSE), the peer's bytes still come; 'peer-ended', the peer's
 * FIN came, ours still go; 'closed', out of the tunnel's table, nothing
 * moves any more (what the local end holds may still reach its reader).
 */
export type ConnectionState = 'open' | 'local-ended' | 'peer-ended' | 'closed';

/**
 * Our direction, to the peer. 'fin-pending': the local end sent its FIN, ours
 * goes out once everything before it is sent (no bytes are taken any more).
 * 'fin-sent': it went out. 'fin-acked': the peer said it arrived (resume).
 * 'fin-resend': a resumed stream's peer lacks it, so it goes out again once
 * the replay is sent. Without half-close a FIN closes the connection from
 * 'fin-pending'. Moves on after the close: a lingering connection's FIN may
 * still be acknowledged, or sent again.
 */
type Sending = 'open' | 'fin-pending' | 'fin-sent' | 'fin-acked' | 'fin-resend';

const SENDING: Lifecycle<Sending> = {
  name: 'connection (our direction)',
  moves: {
    open: ['fin-pending'],
    'fin-pending': ['fin-sent'],
    'fin-sent': ['fin-acked', 'fin-resend'],
    'fin-acked': ['fin-resend'],
    'fin-resend': ['fin-sent'],
  },
};

const FIN_SENT: readonly Sending[] = ['fin-sent'];
const FIN_ARRIVED: readonly Sending[] = ['fin-sent', 'fin-acked'];

/** Sending states in which our FIN has gone out at least once. */
const finWentOut = (s: Sending): boolean => s === 'fin-sent' || s === 'fin-acked' || s === 'fin-resend';

/**
 * The peer's direction, to us: open until its FIN (KANAL_HALF_CLOSE) came.
 * `first`: it came before our local end sent its FIN (who ended the
 * connection, for the audit log). The two 'ended' states are shared
 * constants, so a half-close allocates nothing.
 */
type Receiving = { readonly kind: 'open' } | { readonly kind: 'ended'; readonly first: boolean };

const RECEIVING: Lifecycle<Receiving> = {
  name: 'connection (peer direction)',
  moves: { open: ['ended'], ended: [] },
  describe: (s) => (s.kind === 'ended' ? `ended (${s.first ? 'first' : 'after ours'})` : s.kind),
};
const RECEIVING_OPEN: Receiving = { kind: 'open' };
const PEER_ENDED_FIRST: Receiving = { kind: 'ended', first: true };
const PEER_ENDED_SECOND: Receiving = { kind: 'ended', first: false };

/**
 * How a connection closes: each kind fixes what the local end does with
 * what it holds, whether the peer is told, and whether it was clean (CLOSES).
 * - both-ended: both FINs passed; nothing more to tell the peer.
 * - sent-all: the local end finished and everything it handed over went out.
 * - cut: the local end closed or failed (`by` local), or this proxy cut it
 *   (a fault, a limit, a stall); the peer is told, with the error if any.
 * - peer-closed: the peer's CLOSE_REQ/CLOSE_RSP/DIAL_CLS; what it sent before
 *   still reaches the local reader unless it failed.
 * - tunnel-lost: the tunnel died under it; nothing can be sent any more.
 */
export type ConnectionClose =
  | { readonly kind: 'both-ended' }
  | { readonly kind: 'sent-all' }
  | { readonly kind: 'cut'; readonly by: 'local' | 'proxy'; readonly error?: Error | undefined }
  | { readonly kind: 'peer-closed'; readonly error?: Error | undefined }
  | { readonly kind: 'tunnel-lost'; readonly error: Error };

/**
 * Per kind of close: `clean`, nothing of ours was dropped, so with resume
 * what the peer has not acknowledged is kept (the connection lingers);
 * `by`, who ended it when it failed, or when no FIN came first.
 */
const CLOSES: Readonly<
  Record<
    ConnectionClose['kind'],
    { readonly local: LocalClose; readonly tellPeer: boolean; readonly clean: boolean; readonly by: ConnectionEnder }
  >
> = {
  // Both FINs came, so whose came first names the ender; `by` is never read.
  'both-ended': { local: 'flush', tellPeer: false, clean: true, by: 'peer' },
  'sent-all': { local: 'abort', tellPeer: true, clean: true, by: 'local' },
  cut: { local: 'abort', tellPeer: true, clean: false, by: 'local' }, // `by` as the close says
  'peer-closed': { local: 'flush', tellPeer: false, clean: false, by: 'peer' }, // 'abort' when it failed
  'tunnel-lost': { local: 'abort', tellPeer: false, clean: false, by: 'tunnel' },
};

const BOTH_ENDED: ConnectionClose = { kind: 'both-ended' };
const SENT_ALL: ConnectionClose = { kind: 'sent-all' };

/**
 * The connection in the tunnel's table. 'live': until the local end goes
 * away. 'flushing': the local end went away cleanly; the connection closes
 * once the send queue is empty and our FIN is out, unless `timer` sees no
 * progress for FLUSH_IDLE_MS. 'closed': final; `lingers` (closed cleanly
 * with resume: kept until the peer acknowledges what it lacks), `toldPeer`
 * (a replay after a lost stream sends the close again), and for the audit log
 * who ended it and why.
 */
type Life =
  | { readonly kind: 'live' }
  | { readonly kind: 'flushing'; readonly timer: NodeJS.Timeout }
  | {
      readonly kind: 'closed';
      readonly how: ConnectionClose;
      readonly cleanForResume: boolean;
      readonly toldPeer: boolean;
      readonly endedBy: ConnectionEnder;
      readonly reason: string;
    };

const LIFE: Lifecycle<Life> = {
  name: 'connection',
  moves: { live: ['flushing', 'closed'], flushing: ['closed'], closed: [] },
  describe: (s) => (s.kind === 'closed' ? `closed (${s.how.kind}, by ${s.endedBy})` : s.kind),
};
const LIVE: Life = { kind: 'live' };

export interface ConnectionOptions {
  connectID: number;
  dialID: bigint;
  address: string;
  role: ConnectionRole;
  rules: ConnectionRules;
  limits: TunnelLimits;
  log: Logger;
  /** Where what it holds is charged (the server's ledger); closed once it holds nothing any more. */
  account?: HeldBytes;
}

export class TunnelConnection {
  readonly connectID: number;
  readonly dialID: bigint;
  readonly address: string;
  readonly role: ConnectionRole;
  readonly log: Logger;
  /** Bytes received from the peer. */
  bytesIn = 0;
  /** When it was established (ms since the epoch) and how long its dial took (ms), for the audit log. */
  readonly openedAt = Date.now();
  dialMs = 0;
  /** Who asked for it, when the frontend or node listener that accepted them says (audit log). */
  client: ClientIdentity | undefined;

  /**
   * Our direction (Sending), the peer's (Receiving), and the connection's
   * place in the table (Life): its only state. Invariants: until closed, our
   * FIN out and the peer's FIN in do not hold together (the second closes it,
   * 'both-ended'); 'flushing' only after our local end's FIN ('fin-pending' or
   * later); 'fin-resend' only with resume; 'closed' with cleanForResume only
   * for a clean close (both-ended, sent-all) under resume.
   */
  private readonly sending: StateMachine<Sending>;
  private readonly receiving: StateMachine<Receiving>;
  private readonly life: StateMachine<Life>;
  /** Where the peer's bytes go: an EarlyEnd until attach(), then the socket or the relay partner. */
  private local: LocalEnd = new EarlyEnd();
  /** Our bytes for the peer; stopped (empty) once closed. */
  private readonly sender: ConnectionSendQueue;
  /** Holds the peer's bytes back for a slow local reader: credit, or a stream pause. */
  private readonly inbound: InboundFlow;
  /** What the peer sent that waits for the local reader, as last charged to the account. */
  private chargedInbound = 0;

  constructor(
    private readonly host: ConnectionHost,
    private readonly opts: ConnectionOptions,
  ) {
    this.connectID = opts.connectID;
    this.dialID = opts.dialID;
    this.address = opts.address;
    this.role = opts.role;
    this.log = opts.log;
    this.sender = new ConnectionSendQueue({
      host,
      connectID: opts.connectID,
      window: opts.rules.sendWindow,
      maxDataBytes: opts.limits.maxDataBytes,
      onProgress: this.onSendProgress,
      retain: opts.rules.resume,
      retainLimit: opts.limits.maxWindowBytes,
      ...(opts.account ? { account: opts.account } : {}),
    });
    this.inbound = opts.rules.inboundFlow(host, opts.connectID);
    // Traced only at debug level: no closures per connection otherwise.
    const traced = opts.log.isLevelEnabled('debug');
    const fields = traced ? { connectID: opts.connectID, dialID: String(opts.dialID) } : {};
    this.sending = new StateMachine<Sending>('open', SENDING, debugTrace(SENDING, opts.log, fields, traced));
    this.receiving = new StateMachine<Receiving>(RECEIVING_OPEN, RECEIVING, debugTrace(RECEIVING, opts.log, fields, traced));
    this.life = new StateMachine<Life>(LIVE, LIFE, debugTrace(LIFE, opts.log, fields, traced));
  }

  get limits(): TunnelLimits {
    return this.opts.limits;
  }

  get state(): ConnectionState {
    if (this.life.kind === 'closed') return 'closed';
    // Both ended only within the close itself; our FIN is named first there, as it came first.
    if (finWentOut(this.sending.state)) return 'local-ended';
    return this.receiving.kind === 'ended' ? 'peer-ended' : 'open';
  }

  /** Who ended it, once closed: the party whose failure closed it, else whose FIN came first. */
  get endedBy(): ConnectionEnder | undefined {
    const s = this.life.state;
    return s.kind === 'closed' ? s.endedBy : undefined;
  }

  /** Why it closed (for the tunnel's log line): an error's message, or how it ended cleanly; '' until closed. */
  get closeReason(): string {
    const s = this.life.state;
    return s.kind === 'closed' ? s.reason : '';
  }

  /** Bytes sent to the peer. */
  get bytesOut(): number {
    return this.sender.sent;
  }

  /** True when the local end may hand over more bytes (else it waits for its sendProgress()). */
  get ready(): boolean {
    return this.sender.idle;
  }

  /** Bytes handed over by the local end and not sent yet. */
  get queuedBytes(): number {
    return this.sender.queuedBytes;
  }

  /** Bytes sent and kept until the peer acknowledges them (resume; docs/protocol.md). */
  get unacknowledgedBytes(): number {
    return this.sender.unacknowledged;
  }

  /**
   * Closed cleanly with something the peer has not acknowledged (bytes, or
   * the FIN): with resume the tunnel keeps it so a lost stream loses none of it.
   */
  get lingers(): boolean {
    const s = this.life.state;
    if (s.kind !== 'closed' || !s.cleanForResume) return false;
    return this.sender.unacknowledged > 0 || this.sending.state === 'fin-sent' || this.sending.state === 'fin-resend';
  }

  /** Joins the local end; what arrived before goes to it first. Once. */
  attach(end: LocalEnd): void {
    const early = this.local;
    this.local = end;
    if (early instanceof EarlyEnd) early.replayInto(end);
  }

  // ---------- from the local end ----------

  /** Sends `chunk` to the peer. False: hand over nothing more until `ready` (sendProgress tells). */
  send(chunk: Buffer): boolean {
    // After our FIN or the close, bytes have nowhere to go: dropped, the close is under way.
    if (this.sending.state !== 'open' || this.life.kind === 'closed') return true;
    return this.sender.push(chunk);
  }

  /** The local end sent its FIN. */
  end(): void {
    if (this.sending.state !== 'open' || this.life.kind === 'closed') return;
    this.sending.to('fin-pending');
    this.sendFinWhenSent();
  }

  /** The local reader took bytes: credit goes back to the peer, or a hold is released. */
  taken(): void {
    if (this.life.kind === 'closed') return;
    this.inbound.taken(this.local.undeliveredBytes);
    this.chargeInbound();
  }

  /** The local end went away cleanly: what it handed over is still sent (bounded by FLUSH_IDLE_MS without progress), then the connection closes. */
  finish(): void {
    if (this.life.kind !== 'live') return;
    this.end();
    // Our FIN may have closed it already: a peer without half-close takes a FIN as the whole close.
    if (this.life.kind !== 'live') return;
    if (this.sender.queuedBytes === 0 && !this.finWaits) {
      this.closeAs(SENT_ALL);
      return;
    }
    let left = this.sender.queuedBytes;
    const timer = setInterval(() => {
      // A stream being replaced sends nothing: that is not the peer's stall (the resume timeout bounds it).
      if (this.sender.queuedBytes < left || this.sender.isSuspended) left = this.sender.queuedBytes;
      else this.close(undefined, 'proxy'); // stalled, not slow
    }, FLUSH_IDLE_MS);
    timer.unref();
    this.life.to({ kind: 'flushing', timer });
  }

  /**
   * Closes the connection now: the peer is told (with `error` as the reason
   * when it failed), the local end drops what it holds. `by`: the local end
   * (its socket closed or failed), or this proxy (a fault, a limit, a stall).
   */
  close(error?: Error, by: 'local' | 'proxy' = 'local'): void {
    this.closeAs({ kind: 'cut', by, error });
  }

  // ---------- packets from the peer (called by the tunnel) ----------

  receiveData(data: Uint8Array): void {
    if (this.life.kind === 'closed') return;
    if (this.receiving.kind === 'ended') {
      this.close(new Error('peer sent DATA after closing its side'), 'proxy');
      return;
    }
    this.bytesIn += data.length;
    noteBytesMoved(data.length);
    const fault = this.inbound.received(data.length);
    if (fault) {
      this.log.warn({ connectID: this.connectID, dialID: String(this.dialID), address: this.address }, `closing connection: ${fault}`);
      this.close(new Error(fault), 'proxy');
      return;
    }
    this.local.deliver(Buffer.from(data.buffer, data.byteOffset, data.length));
    // The delivery may have closed the connection (a relay partner closing at once); a call escapes TS's narrowing.
    if (!this.isClosed()) {
      this.inbound.delivered(this.local.undeliveredBytes);
      this.chargeInbound();
    }
  }

  /**
   * KANAL_WINDOW: credit, and with resume what the peer received (it may be
   * for a connection closed here and lingering). False when the peer
   * acknowledged bytes never sent: a protocol fault, and an open connection
   * is closed for it (as for a window overrun), so a lying peer costs one line.
   */
  receiveWindow(increment: number, acknowledged?: number, finReceived?: boolean): boolean {
    if (!this.opts.rules.flowControl) return true;
    if (acknowledged !== undefined && this.opts.rules.resume && !this.sender.acknowledge(acknowledged)) {
      if (this.life.kind !== 'closed') {
        const fault = `peer acknowledged ${acknowledged} bytes, ${this.bytesOut} were sent`;
        this.log.warn({ connectID: this.connectID, dialID: String(this.dialID), address: this.address }, `closing connection: ${fault}`);
        this.close(new Error(fault), 'proxy');
      }
      return false;
    }
    // The peer has our FIN (a resumed stream's peer lacked it: it cannot have it before it is sent again).
    if (finReceived) this.sending.from(FIN_SENT, 'fin-acked');
    if (this.life.kind === 'closed') return true;
    const fault = this.sender.credit(increment);
    if (fault) {
      this.log.warn({ connectID: this.connectID, dialID: String(this.dialID), address: this.address }, `closing connection: ${fault}`);
      this.host.windowFault(this.connectID, fault);
      this.close(new Error(fault), 'proxy');
    }
    return true;
  }

  receiveHalfClose(): void {
    if (this.life.kind === 'closed' || this.receiving.kind === 'ended') return;
    // The state changes before the local end hears of it: a relay partner may answer at once.
    const bothEnded = finWentOut(this.sending.state);
    this.receiving.to(this.sending.state === 'open' ? PEER_ENDED_FIRST : PEER_ENDED_SECOND);
    this.inbound.peerEnded();
    this.local.peerEnded();
    // Both FINs passed: nothing more to tell the peer.
    if (bothEnded) this.closeAs(BOTH_ENDED);
  }

  /** The peer closed the connection (CLOSE_REQ/CLOSE_RSP/DIAL_CLS): what it sent before still reaches the local reader unless it failed. */
  receiveClose(error: string): void {
    this.closeAs({ kind: 'peer-closed', error: error ? new Error(`closed by peer: ${error}`) : undefined });
  }

  /** The tunnel died: nothing can be sent or received any more. */
  abandon(error: Error): void {
    this.closeAs({ kind: 'tunnel-lost', error });
  }

  // ---------- resume (docs/protocol.md, "Resume") ----------

  /** The stream is lost or being replaced: nothing is sent until resume(). */
  suspend(): void {
    this.sender.suspend();
  }

  /** True from suspend() until resume(): the peer has not said yet what it has of this connection. */
  get suspended(): boolean {
    return this.sender.isSuspended;
  }

  /** What this side has of the connection, for the peer after a lost stream. */
  resumeEntry(): ResumePacket {
    return {
      type: PacketType.KANAL_RESUME,
      connectID: this.connectID,
      received: this.inbound.receivedBytes,
      limit: this.inbound.limit,
      finReceived: this.receiving.kind === 'ended',
      dialID: this.dialID,
    };
  }

  /**
   * The peer's entry after a lost stream: send again what it lacks, then our
   * FIN if it lacks that too, and carry on. Returns the bytes sent again, or
   * a fault (the peer's numbers cannot be true).
   */
  resume(received: number, limit: number, finReceived: boolean): { resent: number } | { fault: string } {
    if (this.life.kind === 'closed') return { resent: 0 };
    if (finReceived && !finWentOut(this.sending.state)) return { fault: 'peer claims our FIN arrived, but none was sent' };
    if (!finReceived) this.sending.from(FIN_ARRIVED, 'fin-resend');
    const result = this.sender.resumeAt(received, limit);
    if ('fault' in result) {
      if ('window' in result) this.host.windowFault(this.connectID, result.fault);
      return result;
    }
    // An empty replay reports no progress: the FIN (and a local end waiting to go on) are told here.
    this.onSendProgress();
    return result;
  }

  /** For a connection closed here that lingers: sends what the peer lacks of it, our FIN and close again. Returns the bytes sent again, -1 when its numbers cannot be true. */
  replay(received: number, finReceived: boolean): number {
    const resent = this.sender.replayClosed(received);
    if (resent >= 0) {
      const s = this.life.state;
      if (finWentOut(this.sending.state) && !finReceived) this.host.sendHalfClose(this.connectID);
      if (s.kind === 'closed' && s.toldPeer) this.host.sendClose(this.connectID, this.role, '');
    }
    this.sender.release();
    return resent;
  }

  /** Forgets what was kept for a replay (the tunnel is closing for good, or the peer needs it no more); it holds nothing after. */
  releaseRetained(): void {
    this.sender.release();
    this.opts.account?.close();
  }

  // ---------- state ----------

  /** Charges the account what waits for the local reader now. */
  private chargeInbound(): void {
    const account = this.opts.account;
    if (!account) return;
    const queued = this.local.undeliveredBytes;
    if (queued !== this.chargedInbound) {
      account.buffer(queued - this.chargedInbound);
      this.chargedInbound = queued;
    }
  }

  private isClosed(): boolean {
    return this.life.kind === 'closed';
  }

  /** Our FIN waits to go out (once, or again after a resume). */
  private get finWaits(): boolean {
    return this.sending.state === 'fin-pending' || this.sending.state === 'fin-resend';
  }

  /** Sends our FIN once everything before it is sent. */
  private sendFinWhenSent(): void {
    // Also reached after the local end's sendProgress(), which may have closed the connection.
    if (!this.finWaits || this.sender.queuedBytes > 0 || this.sender.isSuspended || this.life.kind === 'closed') return;
    if (this.sending.state === 'fin-resend') {
      // Resumed: the FIN sent before the stream was lost did not arrive.
      this.sending.to('fin-sent');
      this.host.sendHalfClose(this.connectID);
      return;
    }
    if (!this.opts.rules.halfClose) {
      // Plain Konnectivity has no half-close: a FIN closes the whole connection.
      this.close();
      return;
    }
    if (this.receiving.kind === 'ended') {
      this.host.sendHalfClose(this.connectID);
      this.sending.to('fin-sent');
      this.closeAs(BOTH_ENDED);
    } else {
      this.sending.to('fin-sent');
      this.host.sendHalfClose(this.connectID);
    }
  }

  private readonly onSendProgress = (): void => {
    if (this.life.kind === 'closed') return;
    this.local.sendProgress();
    this.sendFinWhenSent();
    // The local end finished and everything it handed over went out: a clean close, told to the peer.
    if (this.life.kind === 'flushing' && !this.finWaits && this.sender.queuedBytes === 0 && !this.sender.isSuspended)
      this.closeAs(SENT_ALL);
  };

  /** Whose FIN came first (the local end's, or the peer's), while one has. */
  private firstFin(): 'local' | 'peer' | undefined {
    const r = this.receiving.state;
    if (r.kind === 'ended') return r.first ? 'peer' : 'local';
    return this.sending.state === 'open' ? undefined : 'local';
  }

  /**
   * The one way to 'closed': releases what the connection holds, tells the
   * peer when the kind of close says so, and closes the local end.
   */
  private closeAs(how: ConnectionClose): void {
    const before = this.life.state;
    if (before.kind === 'closed') return;
    const spec = CLOSES[how.kind];
    const error = how.kind === 'both-ended' || how.kind === 'sent-all' ? undefined : how.error;
    const by = how.kind === 'cut' ? how.by : spec.by;
    const cleanForResume = spec.clean && this.opts.rules.resume;
    this.life.to({
      kind: 'closed',
      how,
      cleanForResume,
      toldPeer: spec.tellPeer,
      endedBy: error ? by : (this.firstFin() ?? by),
      reason: error?.message ?? (spec.clean ? 'finished' : 'closed'),
    });
    if (before.kind === 'flushing') clearInterval(before.timer);
    this.sender.stop();
    this.inbound.release();
    if (!cleanForResume) this.sender.release();
    if (spec.tellPeer) this.host.sendClose(this.connectID, this.role, error?.message ?? '');
    // What the local end still holds is its own now; what lingers stays charged until acknowledged.
    this.opts.account?.buffer(-this.chargedInbound);
    this.chargedInbound = 0;
    if (!this.lingers) this.opts.account?.close();
    this.host.forget(this.connectID);
    this.local.connectionClosed(how.kind === 'peer-closed' && error ? 'abort' : spec.local, error);
  }
}
