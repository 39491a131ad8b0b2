/**
 * A SOCKS5 client for tests (RFC 1928 CONNECT, RFC 1929 username/password),
 * over any socket: TCP, or a Unix socket (which curl cannot speak SOCKS over).
 * It reads exactly each answer's bytes, so what follows the reply is the
 * destination's; every wait is bounded.
 */
import net from 'node:net';

export interface Socks5Options {
  /** Offered methods; default [0x00], or [0x00, 0x02] with `auth`. */
  methods?: number[];
  auth?: { username: string; password: string };
  /** How long each answer may take; default 10 s. */
  timeoutMs?: number;
}

export type Socks5Outcome =
  /** The method selection refused every method (0xFF). */
  | { kind: 'no-method'; socket: net.Socket }
  /** The RFC 1929 status was not 0. */
  | { kind: 'auth-failed'; status: number; socket: net.Socket }
  /** The reply: `rep` 0 is success, the socket then carries the destination's bytes. */
  | { kind: 'reply'; rep: number; socket: net.Socket };

/** Reads exactly `n` bytes (undefined if the socket ends first); unread bytes go back to the socket. */
export function readExactly(socket: net.Socket, n: number, timeoutMs = 10_000): Promise<Buffer | undefined> {
  return new Promise((resolve, reject) => {
    let got = Buffer.alloc(0);
    const timer = setTimeout(() => finish(new Error(`no ${n} bytes within ${timeoutMs} ms (got ${got.length})`)), timeoutMs);
    const onData = (chunk: Buffer): void => {
      got = Buffer.concat([got, chunk]);
      if (got.length >= n) {
        socket.pause();
        if (got.length > n) socket.unshift(got.subarray(n));
        finish(undefined, got.subarray(0, n));
      }
    };
    const onEnd = (): void => finish(undefined, undefined);
    const finish = (err: Error | undefined, value?: Buffer): void => {
      clearTimeout(timer);
      socket.off('data', onData);
      socket.off('end', onEnd);
      socket.off('close', onEnd);
      if (err) reject(err);
      else resolve(value);
    };
    socket.on('data', onData);
    socket.once('end', onEnd);
    socket.once('close', onEnd);
    socket.resume();
  });
}

/** The request's ATYP and DST.ADDR for `host` (an IPv4 or IPv6 literal, else a domain name). */
export function encodeAddress(host: string, port: number): Buffer {
  let addr: Buffer;
  if (net.isIPv4(host)) addr = Buffer.from([0x01, ...host.split('.').map(Number)]);
  else if (net.isIPv6(host)) {
    const b = Buffer.alloc(17);
    b[0] = 0x04;
    const sa = new net.SocketAddress({ address: host, family: 'ipv6' });
    // Expand "::" into its zero groups.
    const [head, tail = ''] = sa.address.split('::');
    const h = head ? head.split(':') : [];
    const tl = tail ? tail.split(':') : [];
    const groups = sa.address.includes('::') ? [...h, ...Array<string>(8 - h.length - tl.length).fill('0'), ...tl] : h;
    groups.forEach((g, i) => b.writeUInt16BE(parseInt(g, 16), 1 + i * 2));
    addr = b;
  } else addr = Buffer.concat([Buffer.from([0x03, Buffer.byteLength(host)]), Buffer.from(host, 'latin1')]);
  const p = Buffer.alloc(2);
  p.writeUInt16BE(port);
  return Buffer.concat([addr, p]);
}

/** A CONNECT request for host:port. */
export function connectRequest(host: string, port: number): Buffer {
  return Buffer.concat([Buffer.from([0x05, 0x01, 0x00]), encodeAddress(host, port)]);
}

/** The RFC 1929 sub-negotiation. */
export function userPassMessage(username: string, password: string): Buffer {
  const u = Buffer.from(username);
  const p = Buffer.from(password);
  return Buffer.concat([Buffer.from([0x01, u.length]), u, Buffer.from([p.length]), p]);
}

/** Greets, authenticates if `auth`, and asks for a CONNECT to host:port on a connected `socket`. */
export async function socks5Handshake(socket: net.Socket, host: string, port: number, opts: Socks5Options = {}): Promise<Socks5Outcome> {
  const timeoutMs = opts.timeoutMs ?? 10_000;
  const methods = opts.methods ?? (opts.auth ? [0x00, 0x02] : [0x00]);
  socket.write(Buffer.from([0x05, methods.length, ...methods]));
  const choice = await readExactly(socket, 2, timeoutMs);
  if (!choice || choice[0] !== 0x05) throw new Error(`bad method selection ${choice?.toString('hex') ?? '(closed)'}`);
  if (choice[1] === 0xff) return { kind: 'no-method', socket };
  if (choice[1] === 0x02) {
    if (!opts.auth) throw new Error('server chose username/password, none given');
    socket.write(userPassMessage(opts.auth.username, opts.auth.password));
    const status = await readExactly(socket, 2, timeoutMs);
    if (!status) throw new Error('closed during the sub-negotiation');
    if (status[1] !== 0) return { kind: 'auth-failed', status: status[1], socket };
  }
  socket.write(connectRequest(host, port));
  const reply = await readReply(socket, timeoutMs);
  return { kind: 'reply', rep: reply, socket };
}

/** Reads a reply (VER REP RSV ATYP BND.ADDR BND.PORT) and returns REP. */
export async function readReply(socket: net.Socket, timeoutMs = 10_000): Promise<number> {
  const head = await readExactly(socket, 4, timeoutMs);
  if (!head) throw new Error('closed before the reply');
  const atyp = head[3];
  const rest = atyp === 0x01 ? 6 : atyp === 0x04 ? 18 : atyp === 0x03 ? 1 + ((await readExactly(socket, 1, timeoutMs))?.[0] ?? 0) + 2 : 0;
  if (rest > 0 && !(await readExactly(socket, atyp === 0x03 ? rest - 1 : rest, timeoutMs))) throw new Error('closed inside the reply');
  return head[1];
}

/** Connects to a SOCKS5 server at a TCP port or a Unix socket path. */
export async function connectSocks(to: { port: number; host?: string } | { path: string }): Promise<net.Socket> {
  const socket = 'path' in to ? net.connect(to.path) : net.connect(to.port, to.host ?? '127.0.0.1');
  socket.on('error', () => undefined);
  await new Promise<void>((resolve, reject) => {
    socket.once('connect', resolve);
    socket.once('error', reject);
  });
  return socket;
}

/** Everything `socket` still brings until it ends or closes (resumed: readExactly leaves it paused). */
export function readToEnd(socket: net.Socket, timeoutMs = 10_000): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    const timer = setTimeout(() => reject(new Error(`no end within ${timeoutMs} ms`)), timeoutMs);
    const done = (): void => {
      clearTimeout(timer);
      resolve(Buffer.concat(chunks));
    };
    socket.on('data', (c: Buffer) => chunks.push(c));
    socket.once('end', done);
    socket.once('close', done);
    socket.resume();
  });
}

/** A connected pair of Unix sockets, both allowing half-close, in `dir`. */
export async function halfOpenPair(file: string): Promise<[net.Socket, net.Socket]> {
  const server = net.createServer({ allowHalfOpen: true });
  await new Promise<void>((resolve) => server.listen(file, resolve));
  const accepted = new Promise<net.Socket>((resolve) => server.once('connection', resolve));
  const client = net.connect({ path: file, allowHalfOpen: true });
  client.on('error', () => undefined);
  const socket = await accepted;
  server.close();
  return [socket, client];
}
