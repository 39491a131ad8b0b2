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
}

export interface HalfClosePacket {
  type: PacketType.KANAL_HALF_CLOSE;
  connectID: number;
}

export type Packet =
  | DialRequestPacket
  | DialResponsePacket
  | CloseRequestPacket
  | CloseResponsePacket
  | DataPacket
  | CloseDialPacket
  | DrainPacket
  | WindowPacket
  | HalfClosePacket;

export function packetTypeName(type: number): string {
  return PacketType[type] ?? `UNKNOWN(${type})`;
}
