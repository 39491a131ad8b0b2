/** Dials through a tunnel and reads the connection as a stream (src/tunnel/connection-stream.ts). */
import { ConnectionStream } from '../../src/tunnel/connection-stream.js';
import type { DialOptions, Tunnel } from '../../src/tunnel/tunnel.js';

export async function dialStream(tunnel: Tunnel, address: string, opts: DialOptions): Promise<ConnectionStream> {
  return new ConnectionStream(await tunnel.dial(address, opts));
}
