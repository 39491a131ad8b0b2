/**
 * Packets of the Konnectivity protocol (proto/konnectivity.proto) as plain
 * objects. `random` is an int64 chosen by the dialing side and must be echoed
 * exactly, so it is a bigint; connectIDs are small counters and stay numbers
 * (the codec refuses ones beyond 2^53).
 */
export enum PacketType {
  DIAL_REQ = 0,
  DIAL_RSP = 1,
  CLOSE_REQ = 2,
  CLOSE_RSP = 3,
  DATA = 4,
  DIAL_CLS = 5,
  DRAIN = 6,
  KANAL_WINDOW = 100,
  KANAL_HALF_CLOSE = 101,
  KANAL_RESUME = 102,
  KANAL_RESUME_END = 103,
  KANAL_RESOLVE_REQ = 104,
  KANAL_RESOLVE_RSP = 105,
}

export interface DialRequestPacket {
  type: PacketType.DIAL_REQ;
  protocol: string;
  address: string;
  random: bigint;
}

export interface DialResponsePacket {
  type: PacketType.DIAL_RSP;
  error: string;
  connectID: number;
  random: bigint;
}

export interface CloseRequestPacket {
  type: PacketType.CLOSE_REQ;
  connectID: number;
}

export interface CloseResponsePacket {
  type: PacketType.CLOSE_RSP;
  error: string;
  connectID: number;
}

export interface DataPacket {
  type: PacketType.DATA;
  connectID: number;
  error: string;
  data: Uint8Array;
}

export interface CloseDialPacket {
  type: PacketType.DIAL_CLS;
  random: bigint;
}

export interface DrainPacket {
  type: PacketType.DRAIN;
}

export interface WindowPacket {
  type: PacketType.KANAL_WINDOW;
  connectID: number;
  increment: number;
  /** With resume: bytes of this connection received so far (the sender may forget them); absent or 0: none said. */
  acknowledged?: number;
  /** With resume: the sender's FIN arrived (after `acknowledged` bytes). */
  finReceived?: boolean;
}

export interface HalfClosePacket {
  type: PacketType.KANAL_HALF_CLOSE;
  connectID: number;
}

/**
 * With resume, after a tunnel's stream is replaced: one per connection the
 * sender holds (docs/protocol.md, "Resume"). `received` and `finReceived`
 * say what of the peer's bytes arrived; `limit` is the offset up to which
 * the peer may send (its window, absolute); `dialID` names the dial the
 * connection came from.
 */
export interface ResumePacket {
  type: PacketType.KANAL_RESUME;
  connectID: number;
  received: number;
  limit: number;
  finReceived: boolean;
  dialID: bigint;
}

/** With resume: the sender has listed every connection it holds (KANAL_RESUME) and re-sent its pending dials. */
export interface ResumeEndPacket {
  type: PacketType.KANAL_RESUME_END;
}

/**
 * With resolve: please resolve `name` (a host name) where you are and answer
 * KANAL_RESOLVE_RSP with the same `requestID` (chosen by the asker, like a
 * dial's `random`). `timeoutMs`: how long the asker waits (absent: it did not say).
 */
export interface ResolveRequestPacket {
  type: PacketType.KANAL_RESOLVE_REQ;
  requestID: bigint;
  name: string;
  timeoutMs?: number;
}

/**
 * With resolve: the answer to KANAL_RESOLVE_REQ `requestID`: IP literals
 * (at most MAX_RESOLVED_ADDRESSES) or an `error`; `resolver` names who
 * answered; `ttl` (seconds, absent: unknown) how long the answer holds.
 */
export interface ResolveResponsePacket {
  type: PacketType.KANAL_RESOLVE_RSP;
  requestID: bigint;
  addresses: string[];
  error: string;
  resolver: string;
  ttl?: number;
}

/** Bounds of the resolve packets, checked on decode: a peer sending more breaks the protocol (codec.ts). */
export const RESOLVE_BOUNDS = {
  /** RFC 1035 section 2.3.4: 255 octets on the wire, 253 characters as text. */
  nameBytes: 253,
  addresses: 16,
  /** Bytes of `error` and of `resolver`. */
  textBytes: 256,
} as const;

export type Packet =
  | DialRequestPacket
  | DialResponsePacket
  | CloseRequestPacket
  | CloseResponsePacket
  | DataPacket
  | CloseDialPacket
  | DrainPacket
  | WindowPacket
  | HalfClosePacket
  | ResumePacket
  | ResumeEndPacket
  | ResolveRequestPacket
  | ResolveResponsePacket;

export function packetTypeName(type: number): string {
  return PacketType[type] ?? `UNKNOWN(${type})`;
}
