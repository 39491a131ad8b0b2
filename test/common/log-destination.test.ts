/**
 * LogDestination on a real pipe: a reader that stops reading
 * costs a bounded queue, never a blocked caller, and the drop is reported
 * once the reader catches up; a reader that is gone (EPIPE) ends logging and
 * nothing else; flush never waits longer than asked.
 */
import test, { type ExecutionContext } from 'ava';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { LogDestination } from '../../src/common/log-destination.js';
import { textLine } from '../../src/common/log-text.js';

interface Pipe {
  /** Read end (non-blocking), until closed. */
  readFd: number;
  /** Write end, as a process's stdout would be. */
  writeFd: number;
}

function fifo(t: ExecutionContext): Pipe {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kanal-log-'));
  const file = path.join(dir, 'pipe');
  execFileSync('mkfifo', [file]);
  const readFd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NONBLOCK);
  const writeFd = fs.openSync(file, 'w');
  t.teardown(() => {
    for (const fd of [readFd, writeFd]) {
      try {
        fs.closeSync(fd);
      } catch {
        // closed by the test
      }
    }
    fs.rmSync(dir, { recursive: true, force: true });
  });
  return { readFd, writeFd };
}

const line = (i: number): string => `${JSON.stringify({ level: 'info', msg: 'x'.repeat(1000), i })}\n`;

/** What the pipe holds once `needle` arrived (at most 10 s of reading). */
async function readUntil(pipe: Pipe, needle: string): Promise<string> {
  const reader = new net.Socket({ fd: pipe.readFd, readable: true, writable: false });
  let text = '';
  reader.setEncoding('utf8').on('data', (c: string) => (text += c));
  const deadline = Date.now() + 10_000;
  while (!text.includes(needle) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  reader.destroy();
  return text;
}

test('a reader that stops: the queue stays bounded, writes never block, drops are counted and reported later', async (t) => {
  const pipe = fifo(t);
  const max = 256 * 1024;
  const dest = new LogDestination(pipe.writeFd, max);
  // Writing returns (it never waits for the reader: a blocking write would hang here, and the test time out).
  for (let i = 0; i < 4000; i++) dest.write(line(i)); // ~4 MB against a 64 KiB pipe and a 256 KiB queue
  // The reader never reads: flush() returns only because its bound gave up.
  await dest.flush(300);
  const stats = dest.stats();
  t.true(stats.queuedBytes <= max, `queued ${stats.queuedBytes} <= ${max}`);
  t.true(stats.dropped > 3000, `dropped ${stats.dropped}`);

  // The reader comes back: what was queued arrives, then one line with the count.
  const text = await readUntil(pipe, 'log lines dropped');
  const report = text.split('\n').find((l) => l.includes('log lines dropped'));
  t.truthy(report, 'a line reports the drop');
  t.like(JSON.parse(report!) as object, { level: 'warn', dropped: stats.dropped });
  const delivered = text
    .split('\n')
    .filter((l) => l.includes('"i":'))
    .map((l) => (JSON.parse(l) as { i: number }).i);
  t.deepEqual(
    delivered,
    [...delivered].sort((a, b) => a - b),
    'in order',
  );
  t.is(delivered[0], 0, 'the oldest lines were kept');
});

test('with a render (--logging-format=text), queued lines and the drop report are written rendered, the queue counts rendered bytes', async (t) => {
  const pipe = fifo(t);
  const max = 64 * 1024;
  const dest = new LogDestination(pipe.writeFd, max, textLine);
  for (let i = 0; i < 1000; i++) dest.write(line(i));
  await dest.flush(300);
  const { dropped, queuedBytes } = dest.stats();
  t.true(dropped > 0 && queuedBytes <= max, `dropped ${dropped}, queued ${queuedBytes}`);
  const lines = (await readUntil(pipe, 'log lines dropped')).split('\n').filter((l) => l !== '');
  t.true(
    lines.every((l) => /^- INFO {2}x{1000} i=\d+$|^\S+Z WARN {2}log lines dropped: stdout was not read fast enough dropped=\d+$/.test(l)),
    lines.find((l) => !l.startsWith('- INFO')),
  );
  t.is(
    lines.at(-1),
    lines.find((l) => l.includes('dropped=')),
    'the report comes after the queued lines',
  );
  t.regex(lines.at(-1) ?? '', new RegExp(` dropped=${dropped}$`));
});

test('a reader that is gone (EPIPE): logging stops for good, the caller never notices, flush returns at once', async (t) => {
  const pipe = fifo(t);
  fs.closeSync(pipe.readFd);
  const dest = new LogDestination(pipe.writeFd);
  dest.write(line(0));
  await dest.flush(5000);
  t.is(dest.stats().failure, 'EPIPE');
  t.notThrows(() => dest.write(line(1)));
  // Nothing left to wait for: with a bound beyond the test's timeout, returning at all says flush() did not wait.
  await dest.flush(600_000);
  t.is(dest.stats().queuedBytes, 0);
});

// Serial: it replaces fs.write, which the other tests' destinations call too (ava runs serial tests first, alone).
test.serial('lines queued behind a write wait to share the next one; a waiting flush writes them at once', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kanal-log-'));
  const fd = fs.openSync(path.join(dir, 'out'), 'w');
  const realWrite = fs.write;
  const writes: number[] = [];
  let held: (() => void) | undefined;
  // Each write is done, its completion held until the test lets it go.
  const spy = (
    f: number,
    buf: Buffer,
    off: number,
    len: number,
    pos: null,
    cb: (err: NodeJS.ErrnoException | null, n: number) => void,
  ): void => {
    if (f !== fd) {
      realWrite(f, buf, off, len, pos, cb);
      return;
    }
    writes.push(len);
    realWrite(f, buf, off, len, pos, (err, n) => (held = () => cb(err, n)));
  };
  Object.assign(fs, { write: spy });
  t.teardown(() => {
    Object.assign(fs, { write: realWrite });
    fs.closeSync(fd);
    fs.rmSync(dir, { recursive: true, force: true });
  });
  const until = async (ok: () => boolean): Promise<void> => {
    while (!ok()) await new Promise((r) => setTimeout(r, 5));
  };
  const dest = new LogDestination(fd);
  dest.write(line(0));
  await until(() => held !== undefined);
  t.is(writes.length, 1);
  dest.write(line(1));
  dest.write(line(2));
  const release = (): void => {
    const cb = held;
    held = undefined;
    cb?.();
  };
  release();
  t.is(writes.length, 1, 'no write right behind the one that ended');
  await until(() => held !== undefined);
  t.deepEqual(writes, [line(0).length, line(1).length + line(2).length], 'the two lines share one write');
  dest.write(line(3));
  const flushed = dest.flush(5_000);
  release();
  t.is(writes.length, 3, 'a flush does not wait for the linger');
  await until(() => held !== undefined);
  release();
  await flushed;
  t.is(fs.readFileSync(path.join(dir, 'out'), 'utf8'), [0, 1, 2, 3].map(line).join(''));
});
