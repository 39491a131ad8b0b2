/**
 * Stops a socket's native reads before it is handed to a worker that the
 * primary read from (its ClientHello). `socket.pause()` only stops the
 * stream's events: libuv keeps reading until the stream's buffer is full.
 * Node passes the descriptor over the IPC channel but keeps its own handle
 * open until the worker acknowledges it, with `onread` set to a no-op
 * (lib/internal/child_process.js, handleConversion 'net.Socket'), so any byte
 * that arrives in between, such as a TLS client's second flight, is read by
 * the primary and dropped (nodejs/node#8353). A socket accepted with
 * `pauseOnConnect` and never read needs none of this.
 */
import type net from 'node:net';

/**
 * Stops reading `socket` at the descriptor and returns the bytes Node had
 * already taken into its buffer (normally none: they went to 'data'
 * listeners), which the caller sends along with what it read.
 */
export function stopReading(socket: net.Socket): Buffer {
  socket.pause();
  const buffered: Buffer[] = [];
  for (let chunk: unknown = socket.read(); chunk !== null; chunk = socket.read()) {
    if (Buffer.isBuffer(chunk)) buffered.push(chunk);
  }
  // After read(): reading from the buffer may have started the handle reading again.
  const handle: unknown = Reflect.get(socket, '_handle');
  const readStop: unknown = typeof handle === 'object' && handle !== null ? Reflect.get(handle, 'readStop') : undefined;
  if (typeof readStop === 'function') {
    // As net.Socket.prototype.pause does for its own handles (lib/net.js): `reading` tells Node not to start again.
    Reflect.set(handle as object, 'reading', false);
    Reflect.apply(readStop, handle, []);
  }
  return Buffer.concat(buffered);
}
