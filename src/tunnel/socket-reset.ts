/**
 * Abortive closes, both ways. A connection ended by a failure (tunnel lost,
 * dial cancelled, a peer's error) must not look complete to its reader, so a
 * TCP socket is closed with RST, not FIN (RFC 9293 section 3.6.1: "abort"
 * sends a reset): where the reader sees a FIN, a transfer whose end is marked
 * by the close (an HTTP/1.0 body, a log stream) looks whole after any number
 * of bytes. And a reset that reaches us must not be taken for a FIN.
 */
import net from 'node:net';
import tls from 'node:tls';
import type { Duplex } from 'node:stream';
import { getLibc, SOL_SOCKET } from '../../native/libc.js';
import { socketFd } from '../../native/socket-buffers.js';

/**
 * Destroys `socket` (with `error`, which it then emits), with a reset where the
 * transport has one: a TCP socket, or a TLS socket over TCP (the TCP socket
 * under it is reset; Node's TLSSocket refuses resetAndDestroy() itself, its
 * handle being a TLSWrap). A Unix socket has no reset: it is only destroyed,
 * and its reader sees an end (Linux says ECONNRESET to it only when bytes were
 * left unread here: net/unix/af_unix.c, unix_release_sock()). A socket still
 * connecting is destroyed: there is no connection to reset yet.
 */
export function resetSocket(socket: Duplex, error?: Error): void {
  const carrier = carrierOf(socket);
  // While our FIN is being sent, libuv refuses a reset (uv_tcp_close_reset: UV_EINVAL) and Node then
  // drops the handle without closing it (lib/net.js, _destroy): a plain close is all there is then.
  const shuttingDown = socket.writableEnded && socket.writableLength === 0 && !socket.writableFinished;
  if (carrier && !carrier.destroyed && !carrier.connecting && !shuttingDown && Reflect.get(carrier, '_handle')) {
    // Whatever the socket under TLS reports now is of no interest: it is going.
    if (carrier !== socket) carrier.on('error', ignore);
    try {
      carrier.resetAndDestroy();
    } catch {
      // Not a TCP handle (a Unix socket: lib/net.js throws ERR_INVALID_HANDLE_TYPE): destroy is all there is.
    }
  }
  socket.destroy(error);
}

function ignore(): void {}

const SO_ERROR = 4;
const ECONNRESET = 104;
const soError = Buffer.alloc(4);
const soErrorLength = Buffer.alloc(4);

/**
 * Called on a socket's 'end': the reset that libuv reported as an end, if
 * that is what it was. A reset that arrives while bytes are still unread made
 * libuv read them and then, seeing POLLHUP after a short read, report EOF
 * without reading the error (src/unix/stream.c, uv__stream_io; changed by
 * libuv/libuv#4997, in libuv 1.52: Node 26 has it, Node 20 does not). The
 * kernel still holds the error (SO_ERROR, which reading clears); a FIN leaves none.
 */
export function resetBehindEnd(socket: Duplex): Error | undefined {
  const carrier = carrierOf(socket);
  const fd = carrier ? socketFd(carrier) : -1;
  if (fd < 0) return undefined;
  let code: number;
  try {
    soErrorLength.writeUInt32LE(soError.length);
    if (getLibc().getsockopt(fd, SOL_SOCKET, SO_ERROR, soError, soErrorLength) !== 0) return undefined;
    code = soError.readInt32LE(0);
  } catch {
    // No libc to ask (koffi could not load): the end is taken as it came.
    return undefined;
  }
  if (code === 0) return undefined;
  const err: NodeJS.ErrnoException = new Error(code === ECONNRESET ? 'read ECONNRESET' : `read: socket error ${code}`);
  err.code = code === ECONNRESET ? 'ECONNRESET' : `E${code}`;
  return err;
}

/** The socket with the file descriptor under `socket`: itself, or under TLS the one it wraps; none for another Duplex. */
function carrierOf(socket: Duplex): net.Socket | undefined {
  // Node's TLSSocket keeps the socket it wraps as `_parent` (lib/_tls_wrap.js); listeners.ts reads it too.
  const carrier: unknown = socket instanceof tls.TLSSocket ? Reflect.get(socket, '_parent') : socket;
  return carrier instanceof net.Socket && !(carrier instanceof tls.TLSSocket) ? carrier : undefined;
}
