/**
 * A stalled audit log on a real server (docs/operations.md, "The audit log:
 * where it goes"): a FIFO whose reader holds it open and reads nothing. Dials
 * keep working at their pace while the audit queue fills; lines beyond it are
 * dropped and counted, with one warning; once the reader reads, lines flow again.
 */
import test from 'ava';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { scrapeMetrics, startEchoBackend, startProxy, waitUntil } from '../helpers/kanal-processes.js';
import { httpConnect } from '../helpers/in-process.js';

/** Dials through `uds` `total` times, `concurrency` at a time; the statuses seen. */
async function dialMany(uds: string, address: string, total: number, concurrency: number): Promise<Map<number, number>> {
  const statuses = new Map<number, number>();
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < total) {
      next++;
      const r = await httpConnect(uds, address);
      statuses.set(r.status, (statuses.get(r.status) ?? 0) + 1);
      r.socket.destroy();
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  return statuses;
}

test('a FIFO nobody reads: dials go on unaffected, lines beyond the queue are dropped and counted with one warning, and flow again once read', async (t) => {
  t.timeout(180_000);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kanal-audit-fifo-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const fifo = path.join(dir, 'audit.fifo');
  execFileSync('mkfifo', [fifo]);
  // The reader: open, never read (until the end).
  const reader = fs.openSync(fifo, fs.constants.O_RDONLY | fs.constants.O_NONBLOCK);
  t.teardown(() => fs.closeSync(reader));
  const echo = await startEchoBackend(t);
  const { server } = await startProxy(t, { server: { extraArgs: ['--audit-log-path', fifo] }, ready: 'every-agent' });

  // About 9,000 connection lines: more than the pipe (64 KiB) and the queue (4 MiB) hold.
  const statuses = await dialMany(server.uds, echo.address, 9000, 16);
  t.deepEqual([...statuses], [[200, 9000]], 'every dial answered 200 while the audit log stalled');
  const m = await scrapeMetrics(server.healthPort);
  const dropped = m.get('kanal_audit_dropped_lines_total{reason="queue_full"}') ?? 0;
  t.true(dropped > 0, 'lines beyond the queue were dropped');
  t.true((m.get('kanal_audit_queued_bytes') ?? 0) <= 4 * 1024 * 1024, 'the queue stays within its bound');
  t.is(server.logLines().filter((l) => l.msg.startsWith('the audit log destination takes lines slower')).length, 1, 'one warning');

  // The reader reads: what is queued drains, and new lines are written, not dropped.
  const buf = Buffer.alloc(1024 * 1024);
  let read = 0;
  await waitUntil(
    () => {
      for (;;) {
        let n: number;
        try {
          n = fs.readSync(reader, buf);
        } catch {
          return read > 0 && server.logLines().some((l) => l.msg === 'audit log writing again');
        }
        if (n === 0) return false;
        read += n;
      }
    },
    'the queue drained into the reader',
    // Seen over 30 s with both cores busy (a full run beside another).
    90_000,
  );
  const before = (await scrapeMetrics(server.healthPort)).get('kanal_audit_dropped_lines_total{reason="queue_full"}');
  await dialMany(server.uds, echo.address, 10, 1);
  const after = await scrapeMetrics(server.healthPort);
  t.is(after.get('kanal_audit_dropped_lines_total{reason="queue_full"}'), before, 'no drop once read');
});
