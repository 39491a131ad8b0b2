/**
 * The logger bounds every field a peer can fill: the fields
 * of each call, the message, the bindings of child loggers (an agentID on
 * every line of an agent), nested objects, arrays and errors. And repeated
 * events are logged once per interval and key, then counted.
 */
import test from 'ava';
import { setTimeout as sleep } from 'node:timers/promises';
import { boundForLog, MAX_LOG_MESSAGE, MAX_LOG_STRING, truncateForLog } from '../../src/common/log-safety.js';
import { RateLimitedLog } from '../../src/common/rate-limited-log.js';
import { peerHost } from '../../src/domain/refusal-log.js';
import { captureLogger } from '../helpers/memory-stream.js';

const HUGE = 'x'.repeat(1 << 20);

test('truncateForLog keeps short strings and says how much of a long one was cut', (t) => {
  t.is(truncateForLog('short'), 'short');
  t.is(truncateForLog('a'.repeat(MAX_LOG_STRING)), 'a'.repeat(MAX_LOG_STRING));
  t.is(truncateForLog('abcdef', 3), 'abc…[3 more chars]');
});

test('every line of a logger is bounded: fields, message, child bindings, nested values, arrays, buffers and errors', (t) => {
  const logs = captureLogger('debug');
  const child = logs.log.child({ agentID: HUGE }).child({ peer: HUGE });
  child.warn(
    { address: HUGE, nested: { deeper: { list: Array.from({ length: 1000 }, () => HUGE) } }, payload: Buffer.alloc(1 << 20) },
    `message ${HUGE}`,
  );
  child.error({ err: new Error(`peer said ${HUGE}`) }, 'failed');
  child.info(new Error(HUGE));
  t.is(logs.lines.length, 3);
  for (const line of logs.lines) {
    const size = JSON.stringify(line).length;
    t.true(size < 32 * 1024, `a line of ${size} bytes`);
  }
  const [first, second] = logs.lines;
  t.is(first?.agentID, `${'x'.repeat(MAX_LOG_STRING)}…[${(1 << 20) - MAX_LOG_STRING} more chars]`, 'a binding of a child logger');
  t.is(first?.peer, first?.agentID, 'a binding of a grandchild logger');
  t.is(first?.address, first?.agentID, 'a field');
  t.regex(String(first?.msg), /^message x+…\[\d+ more chars\]$/, 'the message');
  t.is(first?.payload, `<${1 << 20} bytes>`);
  const list = (first?.nested as { deeper: { list: string[] } }).deeper.list;
  t.is(list.length, 17, 'sixteen items and a count of the rest');
  t.is(list[16], '…[984 more items]');
  const err = second?.err as { message: string; type: string };
  t.is(err.type, 'Error');
  t.true(err.message.length < MAX_LOG_STRING + 40);
});

test("a message and its err are sentences: kept whole up to MAX_LOG_MESSAGE, a peer's flood still cut", (t) => {
  const logs = captureLogger('debug');
  const sentence = `127.0.0.1:8091: ${'the cause and the flag to change, '.repeat(12)}end`;
  t.true(sentence.length > MAX_LOG_STRING && sentence.length < MAX_LOG_MESSAGE);
  logs.log.warn({ server: sentence, err: sentence }, sentence);
  logs.log.warn({ err: HUGE }, HUGE);
  const [whole, flood] = logs.lines;
  t.is(whole?.msg, sentence);
  t.is(whole?.err, sentence);
  t.is(whole?.server, truncateForLog(sentence), 'any other field is bounded as before');
  t.is(flood?.msg, truncateForLog(HUGE, MAX_LOG_MESSAGE));
  t.is(flood?.err, truncateForLog(HUGE, MAX_LOG_MESSAGE));
});

test('boundForLog bounds depth, keys and the total of one field', (t) => {
  const deep = { a: { b: { c: { d: { e: 'too deep' } } } } };
  t.deepEqual(boundForLog(deep), { a: { b: { c: { d: '[nested too deep]' } } } });
  const wide = Object.fromEntries(Array.from({ length: 100 }, (_, i) => [`k${i}`, i]));
  const bounded = boundForLog(wide) as Record<string, unknown>;
  t.is(Object.keys(bounded).length, 33);
  t.is(bounded['…'], '68 more keys');
  const many = Array.from({ length: 16 }, () => ({ s: HUGE }));
  t.true(JSON.stringify(boundForLog({ many })).length < 9000, 'one field holds at most 8 KiB of text');
  t.is(boundForLog(42), 42);
  t.is(boundForLog(null), null);
});

test('RateLimitedLog: the first event per key is logged, the rest counted and reported once the window ends', async (t) => {
  const logs = captureLogger('debug');
  const limited = new RateLimitedLog(logs.log, 200);
  for (let i = 0; i < 1000; i++) limited.warn('a', { i, peer: HUGE }, 'refused a');
  limited.warn('b', { i: 0 }, 'refused b');
  t.deepEqual(
    logs.lines.map((l) => [l.msg, l.i]),
    [
      ['refused a', 0],
      ['refused b', 0],
    ],
  );
  await sleep(400);
  const summary = logs.matching('refused a (repeated; 999 more suppressed)');
  t.is(summary.length, 1);
  t.is(summary[0]?.suppressed, 999);
  t.is(summary[0]?.i, 0, "the summary carries the first event's fields");
  t.true(String(summary[0]?.peer).length < MAX_LOG_STRING + 40, 'kept fields are bounded');
  t.is(logs.matching('refused b (repeated').length, 0, 'nothing suppressed, nothing to report');
  // A new window starts with the next event.
  limited.warn('a', { i: 1 }, 'refused a');
  t.is(logs.lines.at(-1)?.i, 1);
  limited.flush();
});

test('RateLimitedLog holds at most maxKeys windows: further keys share one', (t) => {
  const logs = captureLogger('debug');
  const limited = new RateLimitedLog(logs.log, 60_000, 10);
  for (let i = 0; i < 10_000; i++) limited.warn(`peer-${i}`, { i }, 'refused');
  t.is(logs.lines.length, 11, 'ten keys and the overflow key');
  limited.flush();
  const summary = logs.matching('refused (repeated;');
  t.is(summary.length, 1);
  t.is(summary[0]?.suppressed, 10_000 - 11);
});

test('peerHost: the same peer from another port is the same key', (t) => {
  t.is(peerHost('127.0.0.1:40000'), '127.0.0.1');
  t.is(peerHost('[::1]:40000'), '::1');
  t.is(peerHost('::1:40000'), '::1');
  t.is(peerHost('unix:/run/kanal.sock'), 'unix:/run/kanal.sock');
  t.is(peerHost('agent node-1'), 'agent node-1');
});
