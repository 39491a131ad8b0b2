/** Reading, writing and hashing byte streams with back-pressure, each bounded in time. */
import { createHash } from 'node:crypto';
import type net from 'node:net';

export function sha256(b: Uint8Array): string {
  return createHash('sha256').update(b).digest('hex');
}

/** Makes a flowing readable deliver at most `bytesPerSecond` on average (a slow reader: the kernel's buffers then fill). */
export function throttle(s: NodeJS.ReadableStream, bytesPerSecond: number): void {
  const t0 = performance.now();
  let got = 0;
  s.on('data', (c: Buffer) => {
    got += c.length;
    const ahead = (got / bytesPerSecond) * 1000 - (performance.now() - t0);
    if (ahead > 1) {
      s.pause();
      setTimeout(() => s.resume(), ahead);
    }
  });
}

/**
 * Reads exactly `n` bytes (at `bytesPerSecond` if given) and resolves with
 * their sha256; rejects if the stream ends or fails first, or after timeoutMs.
 */
/** `what`: the step, for the timeout's message. */
export function readHashed(s: net.Socket, n: number, timeoutMs: number, bytesPerSecond?: number, what = 'reading'): Promise<string> {
  return new Promise<string>((resolve, reject) => {
    const hash = createHash('sha256');
    let got = 0;
    const timer = setTimeout(() => finish(new Error(`${what}: read ${got}/${n} bytes in ${timeoutMs} ms`)), timeoutMs);
    const finish = (err: Error | null): void => {
      clearTimeout(timer);
      s.off('end', onEnd);
      s.off('close', onEnd);
      s.off('error', finish);
      if (err) reject(err);
      else resolve(hash.digest('hex'));
    };
    const onEnd = (): void => finish(new Error(`stream ended after ${got}/${n} bytes`));
    s.on('data', (c: Buffer) => {
      if (got >= n) return;
      const take = c.subarray(0, n - got);
      hash.update(take);
      got += take.length;
      if (got === n) finish(null);
    });
    s.once('end', onEnd);
    s.once('close', onEnd);
    s.once('error', finish);
    if (bytesPerSecond) throttle(s, bytesPerSecond);
    s.resume();
  });
}

/** Writes `data` in 256 KiB chunks, honouring back-pressure. */
export async function writeAll(s: NodeJS.WritableStream & { destroyed?: boolean }, data: Buffer): Promise<void> {
  const CHUNK = 256 * 1024;
  for (let off = 0; off < data.length; off += CHUNK) {
    if (s.destroyed) throw new Error('stream destroyed while writing');
    if (!s.write(data.subarray(off, off + CHUNK))) {
      await new Promise<void>((resolve, reject) => {
        const onDrain = (): void => {
          s.off('close', onClose);
          resolve();
        };
        const onClose = (): void => {
          s.off('drain', onDrain);
          reject(new Error('stream closed while writing'));
        };
        s.once('drain', onDrain);
        s.once('close', onClose);
      });
    }
  }
}

/**
 * Resolves once `s` has delivered at least `n` bytes (bounded by timeoutMs),
 * keeping none of them; it goes on reading (and discarding) afterwards, and
 * errors after that point are ignored.
 */
export function receiveAtLeast(s: net.Socket, n: number, timeoutMs: number, what = 'receiving'): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    let got = 0;
    let done = false;
    const timer = setTimeout(() => {
      done = true;
      reject(new Error(`${what}: only ${got}/${n} bytes in ${timeoutMs} ms`));
    }, timeoutMs);
    s.on('data', (c: Buffer) => {
      got += c.length;
      if (!done && got >= n) {
        done = true;
        clearTimeout(timer);
        resolve();
      }
    });
    s.on('error', (err: Error) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      reject(err);
    });
    s.resume();
  });
}

/** Reads until `n` bytes arrived (pushing back any beyond them); rejects on close/error/timeout first. */
export function readExactly(s: net.Socket | NodeJS.ReadableStream, n: number, timeoutMs: number, what = 'reading'): Promise<Buffer> {
  return new Promise<Buffer>((resolve, reject) => {
    const chunks: Buffer[] = [];
    let got = 0;
    const timer = setTimeout(() => finish(new Error(`${what}: read ${got}/${n} bytes in ${timeoutMs} ms`)), timeoutMs);
    const finish = (err: Error | null): void => {
      clearTimeout(timer);
      s.off('data', onData);
      s.off('end', onEnd);
      s.off('close', onEnd);
      s.off('error', onError);
      if (err) reject(err);
      else resolve(Buffer.concat(chunks));
    };
    const onData = (c: Buffer): void => {
      chunks.push(c);
      got += c.length;
      if (got >= n) {
        (s as net.Socket).pause?.();
        const all = Buffer.concat(chunks);
        // Put back what belongs to a later read.
        if (all.length > n) (s as net.Socket).unshift(all.subarray(n));
        chunks.length = 0;
        chunks.push(all.subarray(0, n));
        finish(null);
      }
    };
    const onEnd = (): void => finish(new Error(`stream ended after ${got}/${n} bytes`));
    const onError = (err: Error): void => finish(err);
    s.on('data', onData);
    s.once('end', onEnd);
    s.once('close', onEnd);
    s.once('error', onError);
    s.resume();
  });
}

/** Reads until the stream ends; rejects on error/timeout. */
export function readToEnd(s: net.Socket | NodeJS.ReadableStream, timeoutMs: number, what = 'reading to the end'): Promise<Buffer> {
  return new Promise<Buffer>((resolve, reject) => {
    const chunks: Buffer[] = [];
    const timer = setTimeout(
      () => finish(new Error(`${what}: no end within ${timeoutMs} ms (${Buffer.concat(chunks).length} bytes read)`)),
      timeoutMs,
    );
    const finish = (err: Error | null): void => {
      clearTimeout(timer);
      s.off('data', onData);
      s.off('end', onEnd);
      s.off('error', onError);
      if (err) reject(err);
      else resolve(Buffer.concat(chunks));
    };
    const onData = (c: Buffer): void => void chunks.push(c);
    const onEnd = (): void => finish(null);
    const onError = (err: Error): void => finish(err);
    s.on('data', onData);
    s.once('end', onEnd);
    s.once('error', onError);
    s.resume();
  });
}

/**
 * Resolves when the peer has closed the connection (EOF, reset or close),
 * discarding any data still arriving; rejects after timeoutMs. The socket is
 * destroyed either way.
 */
export function waitClosed(s: net.Socket, timeoutMs: number, what = 'waiting for the close'): Promise<void> {
  if (s.destroyed || s.readableEnded) {
    s.destroy();
    return Promise.resolve();
  }
  return new Promise<void>((resolve, reject) => {
    const done = (err: Error | null): void => {
      clearTimeout(timer);
      s.off('end', onClosed);
      s.off('close', onClosed);
      s.destroy();
      if (err) reject(err);
      else resolve();
    };
    const onClosed = (): void => done(null);
    const timer = setTimeout(() => done(new Error(`${what}: socket still open after ${timeoutMs} ms`)), timeoutMs);
    s.once('end', onClosed);
    s.once('close', onClosed);
    s.on('error', () => undefined);
    s.on('data', () => undefined);
    s.resume();
  });
}

/** Writes `data` and expects the same bytes back (through an echo backend). */
export async function echoRoundTrip(s: net.Socket, data: Buffer, timeoutMs = 10_000): Promise<boolean> {
  const reading = readExactly(s, data.length, timeoutMs);
  await writeAll(s, data);
  return (await reading).equals(data);
}
