/**
 * What the features negotiated on a stream make of its connections, decided
 * once per tunnel: with the window extension each connection grants its peer
 * credit (ReceiveWindow); without it (upstream peers) only pausing the whole
 * stream holds the peer back (UnflowedHold). With half-close a FIN
 * travels as KANAL_HALF_CLOSE; without it a FIN closes the connection, as in
 * plain Konnectivity.
 */
import type { PacketStream } from '../transport/packet-stream.js';
import { Feature, type FeatureSet } from '../wire/features.js';
import type { TunnelLimits } from './limits.js';
import { ReceiveWindow, type WindowGrowthBudget } from './receive-window.js';
import { UnflowedHold, type UnflowedHost } from './unflowed-hold.js';

/** How one connection holds back the peer's bytes while its local reader is slow. */
export interface InboundFlow {
  /** `bytes` arrived from the peer; returns the protocol fault when it sent more than it may, else undefined. */
  received(bytes: number): string | undefined;
  /** A delivery left `queued` bytes waiting for the local reader. */
  delivered(queued: number): void;
  /** The local reader took bytes: `queued` are left. */
  taken(queued: number): void;
  /** The connection closed: give back what it holds. Once. */
  release(): void;
  /** The peer's FIN arrived (with resume it is acknowledged at once). */
  peerEnded(): void;
  /** Bytes received from the peer so far. */
  readonly receivedBytes: number;
  /** The absolute offset up to which the peer may send (Infinity without flow control). */
  readonly limit: number;
}

/**
 * With resume, received bytes are acknowledged at least this often (with
 * credit, or alone) so the sender can forget them; a smaller tail is
 * acknowledged after ACK_DELAY_MS (docs/protocol.md, "Resume").
 */
export const ACK_EVERY_BYTES = 256 * 1024;
export const ACK_DELAY_MS = 200;

/** What an InboundFlow needs from its tunnel. */
export interface InboundFlowHost extends UnflowedHost {
  readonly windowGrowth: WindowGrowthBudget;
  /** KANAL_WINDOW: credit, and with resume what was received (and whether the FIN was). */
  sendWindow(connectID: number, increment: number, acknowledged?: number, finReceived?: boolean): void;
}

export interface ConnectionRules {
  /** True when the peer grants us credit (KANAL_WINDOW); without it we send unlimited. */
  readonly flowControl: boolean;
  /** True when a FIN is passed on (KANAL_HALF_CLOSE); without it a FIN closes the connection. */
  readonly halfClose: boolean;
  /** True when connections outlive a lost stream: sent bytes are kept until acknowledged, received ones acknowledged. */
  readonly resume: boolean;
  /** Our first send window: the peer's windowBytes, or unlimited. */
  readonly sendWindow: number;
  inboundFlow(host: InboundFlowHost, connectID: number): InboundFlow;
  /** Sets up the stream for these rules (its HTTP/2 receive window without flow control). */
  configureStream(stream: PacketStream): void;
}

export function connectionRules(features: FeatureSet, limits: TunnelLimits): ConnectionRules {
  const halfClose = features.has(Feature.HalfClose);
  if (features.has(Feature.Window)) {
    // Resume replays from acknowledged offsets and ends with a FIN: it needs both.
    const resume = halfClose && features.has(Feature.Resume);
    return {
      flowControl: true,
      halfClose,
      resume,
      sendWindow: limits.windowBytes,
      inboundFlow: (host, connectID) => new WindowedFlow(host, connectID, new ReceiveWindow(limits, host.windowGrowth), resume),
      configureStream: () => undefined,
    };
  }
  return {
    flowControl: false,
    halfClose,
    resume: false,
    sendWindow: Number.POSITIVE_INFINITY,
    inboundFlow: (host, connectID) => new UnflowedFlow(new UnflowedHold(host, connectID, limits.unflowedBufferBytes)),
    // A slow reader pauses the whole stream: what the peer may send meanwhile lands when reading resumes.
    configureStream: (stream) => stream.limitReceiveWindow?.(limits.unflowedReceiveWindowBytes),
  };
}

/**
 * With the window extension: credit goes back as the reader takes bytes; a
 * peer past its window is at fault. With resume each grant also says what
 * was received (what arrived is in the local end, which outlives a lost
 * stream), and received bytes no grant covers are acknowledged alone.
 */
class WindowedFlow implements InboundFlow {
  /** With resume: the received count last sent to the peer. */
  private acknowledged = 0;
  /** With resume: armed while received bytes wait for an acknowledgement. */
  private ackTimer: NodeJS.Timeout | undefined;

  constructor(
    private readonly host: InboundFlowHost,
    private readonly connectID: number,
    private readonly window: ReceiveWindow,
    private readonly acks: boolean,
  ) {}

  get receivedBytes(): number {
    return this.window.received;
  }

  get limit(): number {
    return this.window.limit;
  }

  received(bytes: number): string | undefined {
    const overrun = this.window.receive(bytes);
    if (overrun > 0) return `peer overran the flow-control window (${overrun} > ${this.window.size} bytes)`;
    if (this.acks && this.window.received - this.acknowledged >= ACK_EVERY_BYTES) this.acknowledge(0, false);
    return undefined;
  }

  /** Credit is only counted as the reader takes bytes: right after a delivery the reader would look behind. */
  delivered(): void {}

  taken(queued: number): void {
    const credit = this.window.consumed(queued);
    if (!this.acks) {
      if (credit > 0) this.host.sendWindow(this.connectID, credit);
      return;
    }
    if (credit > 0) this.acknowledge(credit, false);
    else if (this.window.received > this.acknowledged && !this.ackTimer) {
      this.ackTimer = setTimeout(this.delayedAck, ACK_DELAY_MS);
      this.ackTimer.unref();
    }
  }

  peerEnded(): void {
    if (this.acks) this.acknowledge(0, true);
  }

  release(): void {
    clearTimeout(this.ackTimer);
    this.ackTimer = undefined;
    this.window.release();
  }

  private readonly delayedAck = (): void => {
    this.ackTimer = undefined;
    if (this.window.received > this.acknowledged) this.acknowledge(0, false);
  };

  private acknowledge(credit: number, fin: boolean): void {
    this.acknowledged = this.window.received;
    this.host.sendWindow(this.connectID, credit, this.acknowledged, fin);
  }
}

/** Without it: the stream pauses while too much waits for this reader. */
class UnflowedFlow implements InboundFlow {
  constructor(private readonly hold: UnflowedHold) {}

  received(): undefined {
    return undefined;
  }

  delivered(queued: number): void {
    this.hold.update(queued);
  }

  taken(queued: number): void {
    this.hold.update(queued);
  }

  release(): void {
    this.hold.update(0); // releases the hold and the buffered bytes
  }

  /** Without flow control there is no resume: nothing to acknowledge, no offsets kept. */
  peerEnded(): void {}

  get receivedBytes(): number {
    return 0;
  }

  get limit(): number {
    return Number.POSITIVE_INFINITY;
  }
}
