/**
 * An audit character device (a terminal, /dev/null, a serial console): opened
 * O_NONBLOCK and written with fs.write on libuv's thread pool, so a device
 * that does not take more returns EAGAIN instead of holding a pool thread;
 * the rest is tried again after a short pause. A device is never rotated.
 */
import fs from 'node:fs';
import { SinkError, errnoText, type Sink } from './sink.js';

const EAGAIN_RETRY_MS = 50;
const { O_WRONLY, O_NONBLOCK, O_APPEND } = fs.constants;

function writeSome(fd: number, buffer: Buffer, offset: number): Promise<number> {
  return new Promise((resolve, reject) =>
    fs.write(fd, buffer, offset, buffer.length - offset, null, (err, n) => (err ? reject(err) : resolve(n))),
  );
}

export class DeviceSink implements Sink {
  private fd: number | undefined;
  /** The fs.write on the pool now, if any: the descriptor is closed only after it returns (else its number could be reused under it). */
  private inFlight: Promise<number> | undefined;

  constructor(private readonly file: string) {}

  async open(): Promise<void> {
    this.fd = await new Promise<number>((resolve, reject) =>
      fs.open(this.file, O_WRONLY | O_NONBLOCK | O_APPEND, (err, fd) =>
        err ? reject(new SinkError('write_error', 0, `cannot open ${this.file} (${errnoText(err)})`)) : resolve(fd),
      ),
    );
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
