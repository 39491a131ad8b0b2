/**
 * Joins a frontend client's socket to what was dialled for it: a tunnelled
 * connection (splice.ts), or a socket of the server's own (a direct route),
 * byte for byte with half-close both ways.
 */
import type { Duplex } from 'node:stream';
import { splice } from '../../tunnel/splice.js';
import type { Dialed } from './frontend-client.js';

export function joinDialed(socket: Duplex, dialed: Dialed): void {
  if (dialed.via === 'tunnel') {
    splice(socket, dialed.conn);
    return;
  }
  const far = dialed.socket;
  socket.pipe(far);
  far.pipe(socket);
  const cut = (): void => {
    socket.destroy();
    far.destroy();
  };
  socket.once('error', cut);
  far.once('error', cut);
  socket.once('close', () => far.destroy());
  far.once('close', () => socket.destroy());
  socket.resume();
}

/** Closes what was dialled when its client went away before it could be joined. */
export function dropDialed(dialed: Dialed, why: Error): void {
  if (dialed.via === 'tunnel') dialed.conn.close(why);
  else dialed.socket.destroy();
}
