/**
 * The audit log into a FIFO (src/audit/pipe-sink.ts): a reader that holds
 * the FIFO open and never reads costs a bounded queue, never a blocked event
 * loop; lines beyond the bound are dropped, counted, and warned about once;
 * when the reader reads again the lines flow again. A FIFO without a reader
 * is no error at start: lines wait until one opens it, and again after a
 * reader leaves.
 */
import test, { type ExecutionContext } from 'ava';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { Registry } from 'prom-client';
import { DEFAULT_QUEUE, openAuditLog, type AuditLog } from '../../src/audit/audit-log.js';
import { scopedTempDir } from '../../kit/launch/cleanup-scope.js';
import { capturedLog, metricValue, recordOfSize } from '../helpers/audit-log.js';
import { waitUntil } from '../helpers/probes.js';

function makeFifo(t: ExecutionContext): string {
  const file = path.join(scopedTempDir(t, 'kanal-audit-fifo-'), 'audit.fifo');
  execFileSync('mkfifo', [file]);
  return file;
}

/** The read end, opened without waiting for a writer; closed by the test's teardown unless handed to a socket. */
function openReadEnd(t: ExecutionContext, file: string): number {
  const fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NONBLOCK);
  t.teardown(() => {
    try {
      fs.closeSync(fd);
    } catch {
      // handed to a socket, which closed it
    }
  });
  return fd;
}

/** Starts reading `fd`: every complete line, parsed, lands in `lines`. */
function readLines(t: ExecutionContext, fd: number): { lines: { i: number }[]; socket: net.Socket } {
  const socket = new net.Socket({ fd, readable: true, writable: false });
  t.teardown(() => void socket.destroy());
  const lines: { i: number }[] = [];
  let rest = '';
  socket.setEncoding('utf8').on('data', (chunk: string) => {
    const parts = (rest + chunk).split('\n');
    rest = parts.pop()!;
    for (const p of parts) lines.push(JSON.parse(p) as { i: number });
  });
  socket.on('error', () => {});
  return { lines, socket };
}

async function openFifoLog(
  t: ExecutionContext,
  file: string,
  queue?: { maxBytes: number; maxLines: number },
): Promise<{ audit: AuditLog; registry: Registry; captured: ReturnType<typeof capturedLog> }> {
  const registry = new Registry();
  const captured = capturedLog();
  const audit = await openAuditLog({
    file: { path: file, maxBytes: 100 * 1024 * 1024, maxBackups: 0, maxAgeDays: 0 },
    registry,
    log: captured.log,
    ...(queue ? { queue } : {}),
  });
  t.teardown(() => audit.close(100));
  return { audit, registry, captured };
}

/** One turn of the event loop: it resolves only if nothing holds the loop (a blocking write would). */
const nextTurn = (): Promise<void> => new Promise((r) => setImmediate(r));

/**
 * Counts failed opens of `file` (the writer's retries while the FIFO has no reader): node:fs is one
 * shared object, and pipe-sink.ts calls fs.open on it at each attempt. Restored by the teardown.
 */
function countFailedOpens(t: ExecutionContext, file: string): () => number {
  const original = fs.open;
  let failed = 0;
  const wrapped = (...args: unknown[]): void => {
    const callback = args.at(-1) as (err: NodeJS.ErrnoException | null, fd: number) => void;
    const rest = args.slice(0, -1);
    (original as (...a: unknown[]) => void)(...rest, (err: NodeJS.ErrnoException | null, fd: number) => {
      if (err && rest[0] === file) failed++;
      callback(err, fd);
    });
  };
  fs.open = wrapped as typeof fs.open;
  t.teardown(() => void (fs.open = original));
  return () => failed;
}

test('a FIFO nobody reads: writes never hold the event loop, the queue stays bounded, drops are counted and warned once; reading again, lines flow', async (t) => {
  const file = makeFifo(t);
  const readFd = openReadEnd(t, file);
  const { audit, registry, captured } = await openFifoLog(t, file);

  // 16 MiB of lines against a 64 KiB pipe and the 4 MiB queue, in 64 bursts with a turn of the loop
  // and a timer between them: a write that waited for the reader would never return, and neither
  // would the turn nor the timer (the test's timeout then says so).
  const lineBytes = 1024;
  const total = 16 * 1024;
  let turns = 0;
  let timers = 0;
  for (let burst = 0; burst < 64; burst++) {
    for (let j = 0; j < total / 64; j++) audit.write(recordOfSize(burst * (total / 64) + j, lineBytes));
    await nextTurn();
    turns++;
    await new Promise((r) => setTimeout(r, 1));
    timers++;
  }
  t.is(turns, 64, 'the loop turned after every burst');
  t.is(timers, 64, 'a timer fired after every burst');

  const queued = (await metricValue(registry, 'kanal_audit_queued_bytes'))!;
  t.true(queued <= DEFAULT_QUEUE.maxBytes, `queued ${queued} <= ${DEFAULT_QUEUE.maxBytes}`);
  t.true(queued > DEFAULT_QUEUE.maxBytes - 2 * lineBytes, `the queue is full (${queued})`);
  const dropped = (await metricValue(registry, 'kanal_audit_dropped_lines_total', { reason: 'queue_full' }))!;
  const written = (await metricValue(registry, 'kanal_audit_lines_total'))!;
  t.is(written + dropped + queued / lineBytes, total, `written ${written} + dropped ${dropped} + queued ${queued / lineBytes}`);
  t.true(dropped >= total - DEFAULT_QUEUE.maxBytes / lineBytes - 512, `dropped ${dropped}`);
  t.is(captured.warnings().length, 1, JSON.stringify(captured.warnings()));
  t.is(captured.warnings()[0].reason, 'queue_full');

  // The reader reads: what was queued arrives, the episode ends, new lines arrive too.
  const { lines } = readLines(t, readFd);
  await waitUntil(async () => (await metricValue(registry, 'kanal_audit_queued_bytes')) === 0, 'the queue is written', 20_000);
  for (let i = total; i < total + 100; i++) audit.write(recordOfSize(i, lineBytes));
  await waitUntil(() => lines.at(-1)?.i === total + 99, 'the new lines arrive', 20_000);
  const seen = lines.map((l) => l.i);
  t.is(seen[0], 0, 'the oldest lines were kept');
  t.true(
    seen.every((i, k) => k === 0 || i > seen[k - 1]),
    'in order',
  );
  t.is(
    await metricValue(registry, 'kanal_audit_lines_total'),
    written + queued / lineBytes + 100,
    'the queue and the new lines are written',
  );
  t.is(seen.length, written + queued / lineBytes + 100, 'every line written arrived');
  t.is(
    await metricValue(registry, 'kanal_audit_dropped_lines_total', { reason: 'queue_full' }),
    dropped,
    'no drop after the reader came back',
  );
  t.is(captured.warnings().length, 1, 'still one warning');
  t.truthy(
    captured.lines.find((l) => l.msg === 'audit log writing again'),
    'the end of the episode is logged',
  );
});

test('a FIFO without a reader: the start says so and does not wait; lines wait for a reader, and again after a reader leaves', async (t) => {
  const file = makeFifo(t);
  const failedOpens = countFailedOpens(t, file);
  // Nothing opens the read end before this resolves: a start that waited for a reader would never return.
  const { audit, registry, captured } = await openFifoLog(t, file);
  t.is(failedOpens(), 1, 'the start tried once, found no reader, and went on');
  t.regex(captured.warnings()[0]?.msg ?? '', /FIFO has no reader yet \(ENXIO\)/);
  for (let i = 0; i < 10; i++) audit.write({ i });

  const first = readLines(t, openReadEnd(t, file));
  await waitUntil(() => first.lines.length === 10, 'the ten waiting lines arrive once a reader opens the FIFO', 10_000);
  t.deepEqual(
    first.lines.map((l) => l.i),
    [...Array(10).keys()],
  );

  // The reader leaves: the next write fails (EPIPE) and its line is dropped as no_reader; later lines wait for the next reader.
  await new Promise<void>((r) => first.socket.once('close', () => r()).destroy());
  audit.write({ i: 10 });
  await waitUntil(
    async () => (await metricValue(registry, 'kanal_audit_dropped_lines_total', { reason: 'no_reader' })) === 1,
    'the line written with no reader is dropped',
    10_000,
  );
  for (let i = 11; i < 15; i++) audit.write({ i });
  // The writer retries opening while no reader is there; after a retry found none, the lines still wait.
  const before = failedOpens();
  await waitUntil(() => failedOpens() > before, 'a retry of the FIFO finds no reader', 10_000);
  t.is(
    await metricValue(registry, 'kanal_audit_dropped_lines_total', { reason: 'no_reader' }),
    1,
    'lines wait, not dropped, below the bound',
  );
  const second = readLines(t, openReadEnd(t, file));
  await waitUntil(() => second.lines.length === 4, 'the waiting lines arrive at the next reader', 10_000);
  t.deepEqual(
    second.lines.map((l) => l.i),
    [11, 12, 13, 14],
  );
  t.is(await metricValue(registry, 'kanal_audit_lines_total'), 14);
  const warnings = captured.warnings();
  t.is(warnings.length, 2, 'one at start, one for the episode');
  t.is(warnings[1].reason, 'no_reader');
});

test('close() on a FIFO nobody reads returns (its timeout ends the wait); what was left is counted as shutdown, and so is a write after it', async (t) => {
  const file = makeFifo(t);
  openReadEnd(t, file);
  const { audit, registry, captured } = await openFifoLog(t, file);
  const lines = 1000;
  for (let i = 0; i < lines; i++) audit.write(recordOfSize(i, 1024));
  // The reader never reads: close() can only return because its timeout gave up on the lines left.
  await audit.close(300);
  audit.write({ i: lines });
  const written = (await metricValue(registry, 'kanal_audit_lines_total'))!;
  const shutdown = (await metricValue(registry, 'kanal_audit_dropped_lines_total', { reason: 'shutdown' }))!;
  t.true(written < lines, `the pipe took ${written} lines`);
  t.is(written + shutdown, lines + 1, `written ${written} + shutdown ${shutdown}`);
  t.is(await metricValue(registry, 'kanal_audit_queued_bytes'), 0);
  t.is(captured.warnings().filter((w) => w.reason === 'shutdown').length, 1, 'one warning');
});

test('the queue is bounded in lines as well as bytes; a line larger than the whole queue is too_large', async (t) => {
  const file = makeFifo(t);
  const reader = readLines(t, openReadEnd(t, file));
  const { audit, registry } = await openFifoLog(t, file, { maxBytes: 4096, maxLines: 10 });
  // In one turn of the loop: the first line is being written, nine wait, the rest find ten lines queued.
  for (let i = 0; i < 100; i++) audit.write({ i });
  audit.write(recordOfSize(100, 4097));
  t.is(await metricValue(registry, 'kanal_audit_dropped_lines_total', { reason: 'queue_full' }), 90);
  t.is(await metricValue(registry, 'kanal_audit_dropped_lines_total', { reason: 'too_large' }), 1);
  await waitUntil(() => reader.lines.length === 10, 'the ten lines arrive', 10_000);
  t.deepEqual(
    reader.lines.map((l) => l.i),
    [...Array(10).keys()],
  );
});
