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
}

/** What an InboundFlow needs from its tunnel. */
export interface InboundFlowHost extends UnflowedHost {
  readonly windowGrowth: WindowGrowthBudget;
  sendWindow(connectID: number, increment: number): void;
}

export interface ConnectionRules {
  /** True when the peer grants us credit (KANAL_WINDOW); without it we send unlimited. */
  readonly flowControl: boolean;
  /** True when a FIN is passed on (KANAL_HALF_CLOSE); without it a FIN closes the connection. */
  readonly halfClose: boolean;
  /** Our first send window: the peer's windowBytes, or unlimited. */
  readonly sendWindow: number;
  inboundFlow(host: InboundFlowHost, connectID: number): InboundFlow;
  /** Sets up the stream for these rules (its HTTP/2 receive window without flow control). */
  configureStream(stream: PacketStream): void;
}

export function connectionRules(features: FeatureSet, limits: TunnelLimits): ConnectionRules {
  const halfClose = features.has(Feature.HalfClose);
  if (features.has(Feature.Window)) {
    return {
      flowControl: true,
      halfClose,
      sendWindow: limits.windowBytes,
      inboundFlow: (host, connectID) => new WindowedFlow(host, connectID, new ReceiveWindow(limits, host.windowGrowth)),
      configureStream: () => undefined,
    };
  }
  return {
    flowControl: false,
    halfClose,
    sendWindow: Number.POSITIVE_INFINITY,
    inboundFlow: (host, connectID) => new UnflowedFlow(new UnflowedHold(host, connectID, limits.unflowedBufferBytes)),
    // A slow reader pauses the whole stream: what the peer may send meanwhile lands when reading resumes.
    configureStream: (stream) => stream.limitReceiveWindow?.(limits.unflowedReceiveWindowBytes),
  };
}

/** With the window extension: credit goes back as the reader takes bytes; a peer past its window is at fault. */
class WindowedFlow implements InboundFlow {
  constructor(
    private readonly host: InboundFlowHost,
    private readonly connectID: number,
    private readonly window: ReceiveWindow,
  ) {}

  received(bytes: number): string | undefined {
    const overrun = this.window.receive(bytes);
    return overrun > 0 ? `peer overran the flow-control window (${overrun} > ${this.window.size} bytes)` : undefined;
  }

  /** Credit is only counted as the reader takes bytes: right after a delivery the reader would look behind. */
  delivered(): void {}

  taken(queued: number): void {
    const credit = this.window.consumed(queued);
    if (credit > 0) this.host.sendWindow(this.connectID, credit);
  }

  release(): void {
    this.window.release();
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
}
