/**
 * `--audit-log-path -`: audit lines share stdout with the JSON logs, each
 * line whole. A child writes audit lines and log lines of 8 KiB (twice
 * PIPE_BUF, so two writers of one pipe could interleave inside a line) in
 * turn; every line its stdout carries must be one JSON object.
 */
import test, { type ExecutionContext } from 'ava';
import { run } from '../../kit/launch/run-to-end.js';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const CHILD = path.join(path.dirname(fileURLToPath(import.meta.url)), 'fixtures', 'audit-child.js');

interface Line {
  audit?: boolean;
  i?: number;
  msg?: string;
  written?: number;
  queueFull?: number;
}

/** Runs the child writing `lines` audit lines and as many log lines of `lineBytes`; its stdout, each line parsed (a line that is not JSON fails). */
async function childStdout(t: ExecutionContext, lines: number, lineBytes: number): Promise<Line[]> {
  const {
    code,
    stdout: out,
    stderr: err,
  } = await run(process.execPath, [CHILD, 'stdout', String(lines), String(lineBytes)], { timeoutMs: 60_000 });
  t.is(code, 0, err);
  return out
    .split('\n')
    .filter((l) => l !== '')
    .map((l, k) => {
      try {
        return JSON.parse(l) as Line;
      } catch {
        throw new Error(`line ${k} is not one JSON object: ${l.slice(0, 120)}...`);
      }
    });
}

test('audit lines and log lines on one stdout pipe never interleave inside a line', async (t) => {
  // 2 x 300 x 8 KiB: within stdout's 8 MiB queue, nothing is dropped.
  const lines = 300;
  const parsed = await childStdout(t, lines, 8192);
  const audit = parsed.filter((p) => p.audit === true).map((p) => p.i);
  t.deepEqual(audit, [...Array(lines).keys()], 'every audit line, in order');
  t.is(parsed.filter((p) => p.msg === 'a log line').length, lines);
  t.like(
    parsed.find((p) => p.msg === 'done'),
    { written: lines, queueFull: 0 },
  );
});

test("more than stdout's queue holds: audit lines beyond it are dropped as queue_full and counted; every line is still whole", async (t) => {
  // 2 x 2000 x 8 KiB written faster than the parent reads the pipe: the 8 MiB queue fills.
  const lines = 2000;
  const parsed = await childStdout(t, lines, 8192);
  const audit = parsed.filter((p) => p.audit === true);
  const done = parsed.find((p) => p.msg === 'done');
  t.truthy(done);
  t.true(done!.queueFull! > 0, 'some were dropped');
  t.is(done!.written! + done!.queueFull!, lines);
  t.is(audit.length, done!.written!, 'every line counted written arrived');
});
