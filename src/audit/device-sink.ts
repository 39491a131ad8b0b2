/**
 * An audit character device (a terminal, /dev/null, a serial console): opened
 * O_NONBLOCK and written with fs.write on libuv's thread pool, so a device
 * that does not take more returns EAGAIN instead of holding a pool thread;
 * the rest is tried again after a short pause. A device is never rotated.
 */
import fs from 'node:fs';
import { SinkError, errnoText, type Sink } from './sink.js';

const EAGAIN_RETRY_MS = 50;
const { O_WRONLY, O_NONBLOCK, O_APPEND, O_NOFOLLOW } = fs.constants;

function writeSome(fd: number, buffer: Buffer, offset: number): Promise<number> {
  return new Promise((resolve, reject) =>
    fs.write(fd, buffer, offset, buffer.length - offset, null, (err, n) => (err ? reject(err) : resolve(n))),
  );
}

export class DeviceSink implements Sink {
  private fd: number | undefined;
  /** The fs.write on the pool now, if any: the descriptor is closed only after it returns (else its number could be reused under it). */
  private inFlight: Promise<number> | undefined;

  /** `follow`: the path is a symbolic link this user or root made (audit-log.ts, as /dev/stdout); otherwise one is refused (O_NOFOLLOW). */
  constructor(
    private readonly file: string,
    private readonly follow = false,
  ) {}

  async open(): Promise<void> {
    const flags = O_WRONLY | O_NONBLOCK | O_APPEND | (this.follow ? 0 : O_NOFOLLOW);
    const fd = await new Promise<number>((resolve, reject) =>
      fs.open(this.file, flags, (err, fd) =>
        err ? reject(new SinkError('write_error', 0, `cannot open ${this.file} (${errnoText(err)})`)) : resolve(fd),
      ),
    );
    // Only root makes devices; a path swapped for a file or FIFO since the start is refused here.
    if (!fs.fstatSync(fd).isCharacterDevice()) {
      await new Promise<void>((resolve) => fs.close(fd, () => resolve()));
      throw new SinkError('write_error', 0, `refusing ${this.file}: it is no longer a character device`);
    }
    this.fd = fd;
  }

  async write(lines: readonly string[]): Promise<void> {
    const buffer = Buffer.from(lines.join(''), 'utf8');
    let offset = 0;
    while (offset < buffer.length) {
      const fd = this.fd;
      if (fd === undefined) throw new SinkError('write_error', 0, `${this.file} is closed`);
      try {
        this.inFlight = writeSome(fd, buffer, offset);
        offset += await this.inFlight;
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EAGAIN') {
          this.inFlight = undefined;
          await this.close();
          throw new SinkError('write_error', 0, errnoText(err));
        }
        await new Promise((resolve) => setTimeout(resolve, EAGAIN_RETRY_MS));
      } finally {
        this.inFlight = undefined;
      }
    }
  }

  async close(): Promise<void> {
    const fd = this.fd;
    this.fd = undefined;
    await this.inFlight?.catch(() => 0);
    if (fd !== undefined) await new Promise<void>((resolve) => fs.close(fd, () => resolve()));
  }
}
