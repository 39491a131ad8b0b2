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
}

/**
 * 'open': bytes flow both ways. 'local-ended': our FIN went out
 * (KANAL_HALF_CLOSE), the peer's bytes still come. 'peer-ended': the peer's
 * FIN came, ours still go. 'closed': out of the tunnel's table; nothing moves
 * any more (what the local end holds may still reach its reader).
 */
export type ConnectionState = 'open' | 'local-ended' | 'peer-ended' | 'closed';

/** The transitions transition() allows: both FINs, or any close, lead to 'closed'. */
const NEXT_STATES: Readonly<Record<ConnectionState, readonly ConnectionState[]>> = {
  open: ['local-ended', 'peer-ended', 'closed'],
  'local-ended': ['closed'],
  'peer-ended': ['closed'],
  closed: [],
};

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
  /** Who ended it, set as it closes: the party whose failure closed it, else whose FIN came first. */
  endedBy: ConnectionEnder | undefined;
  /** Whose FIN came first (the local end's, or the peer's), while one has. */
  private firstFin: 'local' | 'peer' | undefined;

  /** Changes only in transition(), along NEXT_STATES. */
  private current: ConnectionState = 'open';
  /** Where the peer's bytes go: an EarlyEnd until attach(), then the socket or the relay partner. */
  private local: LocalEnd = new EarlyEnd();
  /** Our bytes for the peer; stopped (empty) once closed. */
  private readonly sender: ConnectionSendQueue;
  /** Holds the peer's bytes back for a slow local reader: credit, or a stream pause. */
  private readonly inbound: InboundFlow;
  /** The local end sent its FIN; ours goes out once the send queue is empty. Only while open or peer-ended. */
  private finPending = false;
  /** The local end went away cleanly: close once the send queue is empty and the FIN is out, unless flushTimer sees no progress. */
  private closeWhenSent = false;
  private flushTimer: NodeJS.Timeout | undefined;
  /** Our FIN went out (KANAL_HALF_CLOSE), and whether the peer acknowledged it (resume). */
  private finSent = false;
  private finAcked = false;
  /** Closed with nothing of ours dropped (both FINs, or our end finished after all was sent): with resume it lingers until acknowledged. */
  private closedCleanly = false;
  /** The close went to the peer (CLOSE_REQ/CLOSE_RSP): a replay after a lost stream sends it again. */
  private closeSent = false;
  /** The peer's FIN arrived (KANAL_HALF_CLOSE). */
  private peerFinReceived = false;
  /** Why it closed (for the tunnel's log line): an error's message, or how it ended cleanly. */
  closeReason = '';
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
  }

  get limits(): TunnelLimits {
    return this.opts.limits;
  }

  get state(): ConnectionState {
    return this.current;
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
    return this.current === 'closed' && this.closedCleanly && (this.sender.unacknowledged > 0 || (this.finSent && !this.finAcked));
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
    if (this.current === 'closed' || this.current === 'local-ended' || this.finPending) return true;
    return this.sender.push(chunk);
  }

  /** The local end sent its FIN. */
  end(): void {
    if (this.current === 'closed' || this.current === 'local-ended' || this.finPending) return;
    this.firstFin ??= 'local';
    this.finPending = true;
    this.sendFinWhenSent();
  }

  /** The local reader took bytes: credit goes back to the peer, or a hold is released. */
  taken(): void {
    if (this.current === 'closed') return;
    this.inbound.taken(this.local.undeliveredBytes);
    this.chargeInbound();
  }

  /** The local end went away cleanly: what it handed over is still sent (bounded by FLUSH_IDLE_MS without progress), then the connection closes. */
  finish(): void {
    if (this.current === 'closed' || this.closeWhenSent) return;
    this.end();
    if (this.sender.queuedBytes === 0 && !this.finPending) {
      this.closeSentAll();
      return;
    }
    this.closeWhenSent = true;
    let left = this.sender.queuedBytes;
    this.flushTimer = setInterval(() => {
      // A stream being replaced sends nothing: that is not the peer's stall (the resume timeout bounds it).
      if (this.sender.queuedBytes < left || this.sender.isSuspended) left = this.sender.queuedBytes;
      else this.close(undefined, 'proxy'); // stalled, not slow
    }, FLUSH_IDLE_MS);
    this.flushTimer.unref();
  }

  /**
   * Closes the connection now: the peer is told (with `error` as the reason
   * when it failed), the local end drops what it holds. `by`: the local end
   * (its socket closed or failed), or this proxy (a fault, a limit, a stall).
   */
  close(error?: Error, by: 'local' | 'proxy' = 'local'): void {
    this.shut(error, 'abort', true, false, by);
  }

  // ---------- packets from the peer (called by the tunnel) ----------

  receiveData(data: Uint8Array): void {
    if (this.current === 'closed') return;
    if (this.current === 'peer-ended') {
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
    // The delivery may have closed the connection (a relay partner closing at once); `state` escapes TS's narrowing.
    if (this.state !== 'closed') {
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
      if (this.current !== 'closed') {
        const fault = `peer acknowledged ${acknowledged} bytes, ${this.bytesOut} were sent`;
        this.log.warn({ connectID: this.connectID, dialID: String(this.dialID), address: this.address }, `closing connection: ${fault}`);
        this.close(new Error(fault), 'proxy');
      }
      return false;
    }
    if (finReceived && this.finSent) this.finAcked = true;
    if (this.current === 'closed') return true;
    const fault = this.sender.credit(increment);
    if (fault) {
      this.log.warn({ connectID: this.connectID, dialID: String(this.dialID), address: this.address }, `closing connection: ${fault}`);
      this.host.windowFault(this.connectID, fault);
      this.close(new Error(fault), 'proxy');
    }
    return true;
  }

  receiveHalfClose(): void {
    if (this.current === 'closed' || this.current === 'peer-ended') return;
    // The state changes before the local end hears of it: a relay partner may answer at once.
    const bothEnded = this.current === 'local-ended';
    this.peerFinReceived = true;
    this.firstFin ??= 'peer';
    if (!bothEnded) this.transition('peer-ended');
    this.inbound.peerEnded();
    this.local.peerEnded();
    // Both FINs passed: nothing more to tell the peer.
    if (bothEnded) this.shut(undefined, 'flush', false, true, 'peer');
  }

  /** The peer closed the connection (CLOSE_REQ/CLOSE_RSP/DIAL_CLS): what it sent before still reaches the local reader unless it failed. */
  receiveClose(error: string): void {
    if (error) this.shut(new Error(`closed by peer: ${error}`), 'abort', false, false, 'peer');
    else this.shut(undefined, 'flush', false, false, 'peer');
  }

  /** The tunnel died: nothing can be sent or received any more. */
  abandon(error: Error): void {
    this.shut(error, 'abort', false, false, 'tunnel');
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
      finReceived: this.peerFinReceived,
      dialID: this.dialID,
    };
  }

  /**
   * The peer's entry after a lost stream: send again what it lacks, then our
   * FIN if it lacks that too, and carry on. Returns the bytes sent again, or
   * a fault (the peer's numbers cannot be true).
   */
  resume(received: number, limit: number, finReceived: boolean): { resent: number } | { fault: string } {
    if (this.current === 'closed') return { resent: 0 };
    if (finReceived && !this.finSent) return { fault: 'peer claims our FIN arrived, but none was sent' };
    if (this.finSent && !finReceived) this.finPending = true;
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
      if (this.finSent && !finReceived) this.host.sendHalfClose(this.connectID);
      if (this.closeSent) this.host.sendClose(this.connectID, this.role, '');
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

  private transition(next: ConnectionState): void {
    if (!NEXT_STATES[this.current].includes(next))
      throw new Error(`connection ${this.connectID}: no transition from ${this.current} to ${next}`);
    this.current = next;
  }

  /** Sends our FIN once everything before it is sent. */
  private sendFinWhenSent(): void {
    // Also reached after the local end's sendProgress(), which may have closed the connection.
    if (!this.finPending || this.sender.queuedBytes > 0 || this.sender.isSuspended || this.current === 'closed') return;
    this.finPending = false;
    if (this.current === 'local-ended') {
      // Resumed: the FIN sent before the stream was lost did not arrive.
      this.host.sendHalfClose(this.connectID);
      return;
    }
    this.finSent = this.opts.rules.halfClose;
    if (!this.opts.rules.halfClose) {
      // Plain Konnectivity has no half-close: a FIN closes the whole connection.
      this.close();
      return;
    }
    if (this.current === 'peer-ended') {
      this.host.sendHalfClose(this.connectID);
      this.shut(undefined, 'flush', false, true, 'local');
    } else {
      this.transition('local-ended');
      this.host.sendHalfClose(this.connectID);
    }
  }

  private readonly onSendProgress = (): void => {
    if (this.current === 'closed') return;
    this.local.sendProgress();
    this.sendFinWhenSent();
    if (this.closeWhenSent && !this.finPending && this.sender.queuedBytes === 0 && !this.sender.isSuspended) this.closeSentAll();
  };

  /** The local end finished and everything it handed over went out: a clean close, told to the peer. */
  private closeSentAll(): void {
    this.shut(undefined, 'abort', true, true, 'local');
  }

  /**
   * The one way to 'closed': releases what the connection holds, tells the
   * peer when `tellPeer`, and closes the local end. `clean`: nothing of ours
   * was dropped, so what the peer has not acknowledged is kept (lingers).
   */
  private shut(error: Error | undefined, local: LocalClose, tellPeer: boolean, clean: boolean, by: ConnectionEnder): void {
    if (this.current === 'closed') return;
    this.transition('closed');
    this.endedBy = error ? by : (this.firstFin ?? by);
    clearInterval(this.flushTimer);
    this.sender.stop();
    this.inbound.release();
    this.closedCleanly = clean && this.opts.rules.resume;
    if (!this.closedCleanly) this.sender.release();
    this.closeSent = tellPeer;
    if (tellPeer) this.host.sendClose(this.connectID, this.role, error?.message ?? '');
    this.closeReason = error?.message ?? (clean ? 'finished' : 'closed');
    // What the local end still holds is its own now; what lingers stays charged until acknowledged.
    this.opts.account?.buffer(-this.chargedInbound);
    this.chargedInbound = 0;
    if (!this.lingers) this.opts.account?.close();
    this.host.forget(this.connectID);
    this.local.connectionClosed(local, error);
  }
}
