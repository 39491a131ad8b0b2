/**
 * The client side of a SOCKS5 CONNECT (RFC 1928), for the load generator: greeting offering
 * "no authentication" and username/password (RFC 1929), the sub-negotiation when the server
 * picks the latter, a CONNECT to an IPv4 address, and the reply. Bounded: every read waits for
 * a known number of bytes, the whole handshake for `timeoutMs`.
 */
import net from 'node:net';

/** A SOCKS5 reply other than success (RFC 1928 §6), or a refused method / credential. */
export class Socks5Refused extends Error {
  constructor(
    readonly code: number,
    message: string,
  ) {
    super(message);
  }
}

/** RFC 1928 §6 reply codes, for messages. */
const REPLIES: Record<number, string> = {
  1: 'general SOCKS server failure',
  2: 'connection not allowed by ruleset',
  3: 'network unreachable',
  4: 'host unreachable',
  5: 'connection refused',
  6: 'TTL expired',
  7: 'command not supported',
  8: 'address type not supported',
};

export interface Socks5Credentials {
  username: string;
  password: string;
}

/**
 * Performs the handshake on a connected `sock` for `host:port` (host an IPv4 literal); resolves
 * with the socket paused and any bytes after the reply unshifted, ready to carry the connection.
 */
export function socks5Connect(
  sock: net.Socket,
  host: string,
  port: number,
  creds: Socks5Credentials,
  timeoutMs: number,
): Promise<net.Socket> {
  const octets = host.split('.').map(Number);
  if (octets.length !== 4 || octets.some((o) => !Number.isInteger(o) || o < 0 || o > 255)) {
    return Promise.reject(new Error(`socks5Connect: ${host} is not an IPv4 literal`));
  }
  return new Promise<net.Socket>((resolve, reject) => {
    let buf: Buffer = Buffer.alloc(0);
    type Stage = 'method' | 'auth' | 'reply';
    let stage: Stage = 'method';
    const timer = setTimeout(() => fail(new Error(`SOCKS5 ${host}:${port}: no reply within ${timeoutMs} ms`)), timeoutMs);
    const cleanup = (): void => {
      clearTimeout(timer);
      sock.off('data', onData);
      sock.off('error', fail);
      sock.off('close', onClose);
    };
    const fail = (err: Error): void => {
      cleanup();
      sock.destroy();
      reject(err);
    };
    const onClose = (): void => fail(new Error(`SOCKS5 ${host}:${port}: closed during the handshake (stage ${stage})`));
    const sendRequest = (): void => {
      const req = Buffer.from([0x05, 0x01, 0x00, 0x01, ...octets, port >> 8, port & 0xff]);
      stage = 'reply';
      sock.write(req);
    };
    const onData = (c: Buffer): void => {
      buf = buf.length === 0 ? c : Buffer.concat([buf, c]);
      for (;;) {
        if (stage === 'method') {
          if (buf.length < 2) return;
          const method = buf[1];
          buf = buf.subarray(2);
          if (method === 0x00) sendRequest();
          else if (method === 0x02) {
            const u = Buffer.from(creds.username);
            const p = Buffer.from(creds.password);
            stage = 'auth';
            sock.write(Buffer.concat([Buffer.from([0x01, u.length]), u, Buffer.from([p.length]), p]));
          } else
            return fail(new Socks5Refused(method, `SOCKS5: the server accepts none of the offered methods (0x${method.toString(16)})`));
          continue;
        }
        if (stage === 'auth') {
          if (buf.length < 2) return;
          const status = buf[1];
          buf = buf.subarray(2);
          if (status !== 0x00) return fail(new Socks5Refused(status, `SOCKS5: username/password refused (status ${status})`));
          sendRequest();
          continue;
        }
        // Reply: VER REP RSV ATYP BND.ADDR BND.PORT; the address's length depends on ATYP.
        if (buf.length < 5) return;
        const atyp = buf[3];
        const addrLen = atyp === 0x01 ? 4 : atyp === 0x04 ? 16 : atyp === 0x03 ? 1 + buf[4] : -1;
        if (addrLen < 0) return fail(new Error(`SOCKS5: reply with unknown address type ${atyp}`));
        const total = 4 + addrLen + 2;
        if (buf.length < total) return;
        const rep = buf[1];
        if (rep !== 0x00) return fail(new Socks5Refused(rep, `SOCKS5 ${host}:${port}: reply ${rep} (${REPLIES[rep] ?? 'unknown'})`));
        cleanup();
        sock.pause();
        const rest = buf.subarray(total);
        if (rest.length > 0) sock.unshift(rest);
        resolve(sock);
        return;
      }
    };
    sock.on('data', onData);
    sock.once('error', fail);
    sock.once('close', onClose);
    sock.write(Buffer.from([0x05, 0x02, 0x00, 0x02]));
  });
}
