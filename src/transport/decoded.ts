/** Deserialization result shared by transports: a packet, or why it is not one. */
import { decodePacket } from '../wire/codec.js';
import { PacketDecodeError } from '../wire/protobuf.js';
import type { Packet } from '../wire/packet.js';

export interface InvalidPacket {
  readonly invalid: string;
}

export type Decoded = Packet | InvalidPacket;

export function isInvalid(d: Decoded): d is InvalidPacket {
  return 'invalid' in d;
}

export function decodeOrExplain(buf: Uint8Array): Decoded {
  try {
    return decodePacket(buf);
  } catch (err) {
    if (err instanceof PacketDecodeError) return { invalid: err.message };
    throw err;
  }
}
