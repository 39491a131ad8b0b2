/**
 * Kanal's log lines through a real pino logger with Kanal's options
 * (logger.ts): level names in JSON, and `--logging-format=text` as one
 * readable, bounded line per record in which nothing a peer sent acts on the
 * terminal (log-text.ts).
 */
import test from 'ava';
import { pino } from 'pino';
import { loggerOptions, RENDER, type LogFormat } from '../../src/common/logger.js';
import { textLine } from '../../src/common/log-text.js';
import { escapeForTerminal } from '../../src/common/terminal-text.js';
import { MAX_LOG_MESSAGE, MAX_LOG_STRING } from '../../src/common/log-safety.js';

/** A logger as createLogger makes it, writing to an array instead of stdout. */
function capture(format: LogFormat): { log: pino.Logger; lines: string[] } {
  const lines: string[] = [];
  const log = pino(loggerOptions('debug', 'server'), { write: (line: string) => void lines.push(RENDER[format](line)) });
  return { log, lines };
}

const TIME = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z /;
/** Every character log-text.ts promises to escape, as a peer could send them. */
const HOSTILE = '\u001b[2J\u001b]0;owned\u0007\r\n\t\u0000\u007f\u009b31m\u2028\u2029\u202e\u2066';

test('JSON lines carry the level by name', (t) => {
  const { log, lines } = capture('json');
  log.info('up');
  log.warn({ agentID: 'a' }, 'slow');
  log.child({ worker: 0 }).error('down');
  t.deepEqual(
    lines.map((l) => (JSON.parse(l) as { level: unknown }).level),
    ['info', 'warn', 'error'],
  );
  t.like(JSON.parse(lines[0]) as object, { level: 'info', component: 'server', msg: 'up' });
});

test('text: time, level, component, message, then key=value in the order logged', (t) => {
  const { log, lines } = capture('text');
  log.child({ serverID: 's1' }).info({ agentID: 'node-1', count: 3, ok: true, none: null }, 'agent connected');
  log.debug('quiet');
  log.warn({ address: 'a b', empty: '', eq: 'x=y', quote: 'say "hi"', list: [1, 'two'], obj: { k: 'v w' } }, 'values');
  t.is(lines.length, 3);
  t.regex(lines[0], TIME);
  t.is(lines[0].replace(TIME, ''), 'INFO  server  agent connected serverID=s1 agentID=node-1 count=3 ok=true none=null\n');
  t.is(lines[1].replace(TIME, ''), 'DEBUG server  quiet\n');
  t.is(
    lines[2].replace(TIME, ''),
    'WARN  server  values address="a b" empty="" eq="x=y" quote="say \\"hi\\"" list=[1,"two"] obj={"k":"v w"}\n',
  );
});

test('text: an error reads as its message (quoted), with its code when the message lacks it; no stack', (t) => {
  const { log, lines } = capture('text');
  const refused = Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:9'), { code: 'ECONNREFUSED' });
  const coded = Object.assign(new Error('the peer went away'), { code: 'EPIPE' });
  log.error({ err: refused }, 'dial failed');
  log.error({ err: coded, cause: new TypeError('bad') }, 'write failed');
  t.is(lines[0].replace(TIME, ''), 'ERROR server  dial failed err="connect ECONNREFUSED 127.0.0.1:9"\n');
  t.is(lines[1].replace(TIME, ''), 'ERROR server  write failed err="the peer went away (EPIPE)" cause="bad"\n');
  t.false(lines.join('').includes(' at '), 'no stack frames');
});

test('text: control characters, separators and bidi overrides from a peer are escaped in message, values, keys and nested objects', (t) => {
  const { log, lines } = capture('text');
  log.warn({ address: `evil${HOSTILE}:443`, metadata: { [`k${HOSTILE}`]: [HOSTILE] }, [`key${HOSTILE}`]: 1 }, `refused ${HOSTILE}`);
  t.is(lines.length, 1);
  const line = lines[0];
  t.true(line.endsWith('\n'));
  const body = line.slice(0, -1);
  // eslint-disable-next-line no-control-regex -- what must not reach a terminal
  t.notRegex(body, /[\u0000-\u001f\u007f-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069]/, 'nothing unsafe left raw');
  const escaped = '\\u001b[2J\\u001b]0;owned\\u0007\\r\\n\\t\\u0000\\u007f\\u009b31m\\u2028\\u2029\\u202e\\u2066';
  t.true(body.includes(`refused ${escaped} `), body);
  t.true(body.includes(`address="evil${escaped}:443"`), body);
  t.true(body.includes(`"key${escaped}"=1`), body);
  t.true(body.includes(`metadata={"k${escaped}":["${escaped}"]}`), body);
  t.is(escapeForTerminal('plain ascii, ünïcode and emoji 🙂'), 'plain ascii, ünïcode and emoji 🙂', 'printable text is kept');
});

test('text: bounded fields stay bounded; a line that is not JSON is kept, escaped', (t) => {
  const { log, lines } = capture('text');
  const huge = '\u001b'.repeat(1 << 20);
  log.warn({ address: huge, agentID: 'x'.repeat(1 << 20) }, huge);
  t.is(lines.length, 1);
  // Two fields of at most MAX_LOG_STRING characters and the message of at most MAX_LOG_MESSAGE, each character escaped to at most 6, plus the cut notes.
  t.true(lines[0].length < 6 * (2 * MAX_LOG_STRING + MAX_LOG_MESSAGE) + 200, `${lines[0].length} characters`);
  t.true(lines[0].includes(`more chars]`));
  t.is(textLine('not json \u001b[31m\n'), 'not json \\u001b[31m\n');
  t.is(textLine('[1,2]\n'), '[1,2]\n');
});

test('text: a line of another writer (pino numbers, no component) still reads', (t) => {
  t.is(textLine('{"level":30,"time":0,"msg":"hello","n":1}\n'), '1970-01-01T00:00:00.000Z INFO  hello n=1\n');
  t.is(textLine('{"msg":"bare"}\n'), '- -     bare\n');
});
