/**
 * An audit FIFO (or a pipe named by a path such as /proc/<pid>/fd/<n>),
 * written without ever blocking the event loop. Opening a FIFO for writing
 * blocks until a reader opens it (fifo(7)), so it is opened with O_NONBLOCK:
 * without a reader that fails at once with ENXIO (open(2)), reported as
 * no_reader and retried. Writes go through a net.Socket on the descriptor,
 * which libuv keeps non-blocking (Node's own process.stdout sets pipes
 * blocking on Linux: Node's docs, process, "A note on process I/O"); the
 * queue in front holds one batch in the socket at a time, so what waits in
 * the socket counts against the same bound. O_NOFOLLOW and the owner check
 * on the opened descriptor keep a FIFO another user planted from being
 * written (owned-files.ts).
 */
import fs from 'node:fs';
import net from 'node:net';
import { notOwnFileProblem } from '../common/owned-files.js';
import { SinkError, errnoText, type Sink } from './sink.js';

const { O_WRONLY, O_NONBLOCK, O_NOFOLLOW } = fs.constants;

function openNonBlocking(file: string, follow: boolean): Promise<number> {
  const flags = O_WRONLY | O_NONBLOCK | (follow ? 0 : O_NOFOLLOW);
  return new Promise((resolve, reject) => fs.open(file, flags, (err, fd) => (err ? reject(err) : resolve(fd))));
}

/** Why what `fd` opened is not a pipe of ours (it was replaced after the start checked it), or undefined. */
function notOurPipe(fd: number): string | undefined {
  const stat = fs.fstatSync(fd);
  if (!stat.isFIFO() && !stat.isSocket()) return 'is no longer a FIFO';
  return stat.isFIFO() ? notOwnFileProblem(stat) : undefined;
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

  /** `follow`: the path is a symbolic link this user or root made (audit-log.ts); otherwise one is refused (O_NOFOLLOW). */
  constructor(
    private readonly file: string,
    private readonly follow = false,
  ) {}

  async open(): Promise<void> {
    let fd: number;
    try {
      fd = await openNonBlocking(this.file, this.follow);
    } catch (err) {
      throw new SinkError(lostReader(err) ? 'no_reader' : 'write_error', 0, `cannot open ${this.file} (${errnoText(err)})`);
    }
    // Opened, so it is what is written to: checked on the descriptor, as another user may have swapped the path since the start.
    const problem = notOurPipe(fd);
    if (problem) {
      fs.close(fd, () => {});
      throw new SinkError('write_error', 0, `refusing ${this.file}: it ${problem}`);
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
