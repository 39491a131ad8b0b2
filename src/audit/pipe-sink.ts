/**
 * An audit FIFO (or a pipe named by a path such as /proc/<pid>/fd/<n>),
 * written without ever blocking the event loop. Opening a FIFO for writing
 * blocks until a reader opens it (fifo(7)), so it is opened with O_NONBLOCK:
 * without a reader that fails at once with ENXIO (open(2)), reported as
 * no_reader and retried. Writes go through a net.Socket on the descriptor,
 * which libuv keeps non-blocking (Node's own process.stdout sets pipes
 * blocking on Linux: Node's docs, process, "A note on process I/O"); the
 * queue in front holds one batch in the socket at a time, so what waits in
 * the socket counts against the same bound.
 */
import fs from 'node:fs';
import net from 'node:net';
import { SinkError, errnoText, type Sink } from './sink.js';

const { O_WRONLY, O_NONBLOCK } = fs.constants;

function openNonBlocking(file: string): Promise<number> {
  return new Promise((resolve, reject) => fs.open(file, O_WRONLY | O_NONBLOCK, (err, fd) => (err ? reject(err) : resolve(fd))));
}

/** A reader that is not there, or went away. */
function lostReader(err: unknown): boolean {
  const code = (err as NodeJS.ErrnoException | undefined)?.code;
  return code === 'ENXIO' || code === 'EPIPE';
}

export class PipeSink implements Sink {
  private socket: net.Socket | undefined;
  /** Rejects the write in flight when the socket closes under it. */
  private rejectInFlight: ((err: Error) => void) | undefined;

  constructor(private readonly file: string) {}

  async open(): Promise<void> {
    let fd: number;
    try {
      fd = await openNonBlocking(this.file);
    } catch (err) {
      throw new SinkError(lostReader(err) ? 'no_reader' : 'write_error', 0, `cannot open ${this.file} (${errnoText(err)})`);
    }
    let socket: net.Socket;
    try {
      socket = new net.Socket({ fd, readable: false, writable: true });
    } catch (err) {
      fs.close(fd, () => {});
      throw new SinkError('write_error', 0, `cannot write ${this.file} as a pipe (${errnoText(err)})`);
    }
    // Errors reach the write's callback; the listener keeps them from being thrown.
    socket.on('error', () => {});
    socket.on('close', () => {
      if (this.socket === socket) this.socket = undefined;
      this.rejectInFlight?.(new SinkError('write_error', 0, `${this.file} closed`));
    });
    this.socket = socket;
  }

  write(lines: readonly string[]): Promise<void> {
    const socket = this.socket;
    if (!socket) return Promise.reject(new SinkError('write_error', 0, `${this.file} is closed`));
    return new Promise<void>((resolve, reject) => {
      const settle = (err?: Error | null): void => {
        if (this.rejectInFlight !== fail) return;
        this.rejectInFlight = undefined;
        if (!err) {
          resolve();
          return;
        }
        socket.destroy();
        reject(err instanceof SinkError ? err : new SinkError(lostReader(err) ? 'no_reader' : 'write_error', 0, errnoText(err)));
      };
      const fail = (err: Error): void => settle(err);
      this.rejectInFlight = fail;
      socket.write(Buffer.from(lines.join(''), 'utf8'), settle);
    });
  }

  async close(): Promise<void> {
    const socket = this.socket;
    this.socket = undefined;
    if (!socket || socket.destroyed) return;
    await new Promise<void>((resolve) => {
      socket.once('close', () => resolve());
      socket.destroy();
    });
  }
}
