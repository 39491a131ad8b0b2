/**
 * The HTTP front doors' request head parser: every prefix of a valid
 * head asks for more, every split of it into two chunks gives the same head
 * and the same bytes after it, a head beyond the cap (in bytes or header
 * lines) is 431 however it arrives, malformed lines are 400 with the code
 * Node's parser used, and a head gives its version, target form and header
 * lines (RFC 9112 sections 2.2, 3.2, 5).
 */
import test from 'ava';
import { DEFAULT_MAX_HEADERS, RequestHeadParser, type HeadVerdict } from '../../src/server/frontends/request-head.js';

const MAX = 16 * 1024;
const HEAD = 'CONNECT 10.0.0.1:10250 HTTP/1.1\r\nHost: 10.0.0.1:10250\r\nUser-Agent: kube-apiserver\r\nX-Empty:\r\nX-Tab:\tv a l\r\n\r\n';

function parse(input: string | Buffer, max = MAX): HeadVerdict {
  return new RequestHeadParser(max).push(typeof input === 'string' ? Buffer.from(input, 'latin1') : input);
}

function code(v: HeadVerdict): string {
  return v.kind === 'bad' ? `${v.status} ${v.code}` : v.kind;
}

test('a complete head: method, target, and the bytes after it', (t) => {
  const v = parse(`${HEAD}early bytes`);
  if (v.kind !== 'head') return t.fail(code(v));
  t.is(v.method, 'CONNECT');
  t.is(v.target, '10.0.0.1:10250');
  t.is(v.rest.toString(), 'early bytes');
  t.like(parse('GET /x?y=1 HTTP/1.0\r\n\r\n'), { kind: 'head', method: 'GET', target: '/x?y=1' });
  // Empty lines before the request line are skipped (RFC 9112 section 2.2).
  t.like(parse(`\r\n\r\n${HEAD}`), { kind: 'head', method: 'CONNECT' });
  t.like(parse('CONNECT [::1]:443 HTTP/1.1\r\n\r\n'), { kind: 'head', target: '[::1]:443' });
});

test('every prefix of a head asks for more; every split into two chunks gives the same head', (t) => {
  const full = Buffer.from(`${HEAD}after`, 'latin1');
  const headLength = Buffer.byteLength(HEAD);
  for (let n = 0; n < headLength; n++) {
    t.is(code(parse(full.subarray(0, n))), 'more', `prefix of ${n} bytes`);
    const p = new RequestHeadParser(MAX);
    t.is(code(p.push(full.subarray(0, n))), 'more');
    const v = p.push(full.subarray(n));
    if (v.kind !== 'head') return t.fail(`split at ${n}: ${code(v)}`);
    t.is(v.target, '10.0.0.1:10250');
    t.is(v.rest.toString(), 'after', `split at ${n}`);
  }
  // One byte at a time.
  const p = new RequestHeadParser(MAX);
  let v: HeadVerdict = { kind: 'more' };
  for (let i = 0; i < headLength; i++) {
    t.is(v.kind, 'more');
    v = p.push(full.subarray(i, i + 1));
  }
  t.like(v, { kind: 'head', method: 'CONNECT', target: '10.0.0.1:10250' });
});

test('the end of the client before the head is complete is 400 HPE_INVALID_EOF_STATE; a verdict is final', (t) => {
  for (const n of [1, 10, Buffer.byteLength(HEAD) - 1]) {
    const p = new RequestHeadParser(MAX);
    p.push(Buffer.from(HEAD.slice(0, n), 'latin1'));
    t.is(code(p.end()), '400 HPE_INVALID_EOF_STATE');
  }
  const p = new RequestHeadParser(MAX);
  const first = p.push(Buffer.from(HEAD));
  t.is(p.push(Buffer.from('more')), first);
  t.is(p.end(), first);
});

test('a head larger than the cap is 431 whether it comes at once or in pieces; one that just fits is not', (t) => {
  const long = `CONNECT ${'a'.repeat(1 << 20)}:443 HTTP/1.1\r\n\r\n`;
  t.is(code(parse(long)), '431 HPE_HEADER_OVERFLOW');
  // Header lines without end, in pieces: bounded all the same.
  const p = new RequestHeadParser(MAX);
  let v = p.push(Buffer.from('CONNECT a:1 HTTP/1.1\r\n'));
  for (let i = 0; v.kind === 'more' && i < 1000; i++) v = p.push(Buffer.from('X-Filler: 0123456789012345678901234567890123456789\r\n'));
  t.is(code(p.push(Buffer.from('CONNECT'))), '431 HPE_HEADER_OVERFLOW', 'once decided, the verdict stays');
  t.is(code(v), '431 HPE_HEADER_OVERFLOW');
  const exact = `CONNECT a:1 HTTP/1.1\r\nX: ${'v'.repeat(MAX - 29)}\r\n\r\n`;
  t.is(Buffer.byteLength(exact), MAX);
  t.is(code(parse(exact)), 'head');
  t.is(code(parse(`${exact.slice(0, -4)}v\r\n\r\n`)), '431 HPE_HEADER_OVERFLOW');
  t.is(code(parse(`CONNECT a:1 HTTP/1.1\r\nX: y\r\n`, 24)), '431 HPE_HEADER_OVERFLOW');
});

test("malformed request lines and header fields are 400, with the code of Node's parser", (t) => {
  const cases: [string, string][] = [
    ['\x00\x00garbage\r\n\r\n', 'HPE_INVALID_METHOD'],
    [' CONNECT a:1 HTTP/1.1\r\n\r\n', 'HPE_INVALID_METHOD'],
    ['CON(NECT a:1 HTTP/1.1\r\n\r\n', 'HPE_INVALID_METHOD'],
    ['\r\r\n', 'HPE_LF_EXPECTED'],
    ['\n', 'HPE_INVALID_METHOD'],
    ['CONNECT  a:1 HTTP/1.1\r\n\r\n', 'HPE_INVALID_URL'],
    ['CONNECT a\x01:1 HTTP/1.1\r\n\r\n', 'HPE_INVALID_URL'],
    ['CONNECT a:1\r\n\r\n', 'HPE_INVALID_URL'],
    ['CONNECT a:\xff1 HTTP/1.1\r\n\r\n', 'HPE_INVALID_URL'],
    ['CONNECT a:1 HTTP/2.0\r\n\r\n', 'HPE_INVALID_VERSION'],
    ['CONNECT a:1 HTTP/1.2\r\n\r\n', 'HPE_INVALID_VERSION'],
    ['CONNECT a:1 http/1.1\r\n\r\n', 'HPE_INVALID_VERSION'],
    ['CONNECT a:1 HTTP/1.1 \r\n\r\n', 'HPE_CR_EXPECTED'],
    ['CONNECT a:1 HTTP/1.1\n\r\n', 'HPE_CR_EXPECTED'],
    ['CONNECT a:1 HTTP/1.1\rX', 'HPE_LF_EXPECTED'],
    ['CONNECT a:1 HTTP/1.1\r\nHost : a\r\n\r\n', 'HPE_INVALID_HEADER_TOKEN'],
    ['CONNECT a:1 HTTP/1.1\r\n: a\r\n\r\n', 'HPE_INVALID_HEADER_TOKEN'],
    ['CONNECT a:1 HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n', 'HPE_INVALID_HEADER_TOKEN'],
    ['CONNECT a:1 HTTP/1.1\r\nHost: a\x00b\r\n\r\n', 'HPE_INVALID_HEADER_TOKEN'],
    ['CONNECT a:1 HTTP/1.1\r\nHost: a\nX: b\r\n\r\n', 'HPE_INVALID_HEADER_TOKEN'],
    ['CONNECT a:1 HTTP/1.1\r\nHost: a\x7f\r\n\r\n', 'HPE_INVALID_HEADER_TOKEN'],
    ['CONNECT a:1 HTTP/1.1\r\nHost: a\r\n\n', 'HPE_INVALID_HEADER_TOKEN'],
    ['CONNECT a:1 HTTP/1.1\r\nHost: a\rb\r\n\r\n', 'HPE_LF_EXPECTED'],
    ['CONNECT a:1 HTTP/1.1\r\nHost: a\r\n\rX', 'HPE_LF_EXPECTED'],
  ];
  for (const [input, want] of cases) t.is(code(parse(input)), `400 ${want}`, JSON.stringify(input));
  // obs-text in a value is allowed (RFC 9110 section 5.5).
  t.is(code(parse('CONNECT a:1 HTTP/1.1\r\nX: caf\xe9\r\n\r\n')), 'head');
});

test('a head gives its version, its target form and its header lines, values without the whitespace around them', (t) => {
  const v = parse(`${HEAD}rest`);
  if (v.kind !== 'head') return t.fail(code(v));
  t.is(v.version, 'HTTP/1.1');
  t.is(v.form, 'authority');
  t.deepEqual(v.headers, [
    { name: 'Host', value: '10.0.0.1:10250' },
    { name: 'User-Agent', value: 'kube-apiserver' },
    { name: 'X-Empty', value: '' },
    { name: 'X-Tab', value: 'v a l' },
  ]);
  t.like(parse('GET /x HTTP/1.0\r\nA:b\r\nA: \t c d \t\r\n\r\n'), {
    kind: 'head',
    version: 'HTTP/1.0',
    form: 'origin',
    headers: [
      { name: 'A', value: 'b' },
      { name: 'A', value: 'c d' },
    ],
  });
  t.like(parse('GET /x HTTP/1.1\r\n\r\n'), { kind: 'head', headers: [] });
});

test("the target's form follows its method (RFC 9112 section 3.2): absolute-form for a proxy, an asterisk only for OPTIONS, none other", (t) => {
  const head = (line: string): HeadVerdict => parse(`${line}\r\nHost: example.com\r\n\r\n`);
  t.like(head('GET http://example.com:8080/p?q=1 HTTP/1.1'), { kind: 'head', form: 'absolute', target: 'http://example.com:8080/p?q=1' });
  t.like(head('POST https://[::1]/ HTTP/1.1'), { kind: 'head', form: 'absolute' });
  t.like(head('OPTIONS * HTTP/1.1'), { kind: 'head', form: 'asterisk' });
  t.like(head('OPTIONS /x HTTP/1.1'), { kind: 'head', form: 'origin' });
  // CONNECT takes only authority-form; whoever dials it checks host:port (a 400 there).
  t.like(head('CONNECT example.com:443 HTTP/1.1'), { kind: 'head', form: 'authority' });
  t.like(head('CONNECT /x HTTP/1.1'), { kind: 'head', form: 'authority', target: '/x' });
  for (const line of ['GET * HTTP/1.1', 'GET 10.0.0.1:443 HTTP/1.1', 'GET 1http://x/ HTTP/1.1', 'GET x HTTP/1.1']) {
    const v = head(line);
    t.is(code(v), '400 HPE_INVALID_URL', line);
    if (v.kind === 'bad') t.regex(v.reason, /RFC 9112 section 3\.2/);
  }
});

test('more header lines than the limit is 431, at once or in pieces; exactly the limit is a head', (t) => {
  const lines = (n: number): string => Array.from({ length: n }, (_, i) => `X-${i}: ${i}\r\n`).join('');
  t.like(new RequestHeadParser(MAX, 3).push(Buffer.from(`CONNECT a:1 HTTP/1.1\r\n${lines(3)}\r\n`)), { kind: 'head' });
  const over = new RequestHeadParser(MAX, 3).push(Buffer.from(`CONNECT a:1 HTTP/1.1\r\n${lines(4)}\r\n`));
  t.is(code(over), '431 HPE_HEADER_OVERFLOW');
  if (over.kind === 'bad') t.is(over.reason, 'more than 3 header lines');
  // The default bound, one line at a time: decided at the first line past it, before the head ends.
  const p = new RequestHeadParser(MAX);
  let v = p.push(Buffer.from('CONNECT a:1 HTTP/1.1\r\n'));
  let sent = 0;
  for (; v.kind === 'more' && sent < 1000; sent++) v = p.push(Buffer.from(`X-${sent}: ${sent}\r\n`));
  t.is(code(v), '431 HPE_HEADER_OVERFLOW');
  t.is(sent, DEFAULT_MAX_HEADERS + 1);
});

test('obs-fold, whitespace after the request line and a bare CR are 400, each saying which (RFC 9112 sections 5.2, 2.2)', (t) => {
  const reason = (input: string): string => {
    const v = parse(input);
    return v.kind === 'bad' ? `${v.status} ${v.code}: ${v.reason}` : v.kind;
  };
  t.regex(reason('CONNECT a:1 HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n'), /^400 HPE_INVALID_HEADER_TOKEN: obs-fold/);
  t.regex(reason('CONNECT a:1 HTTP/1.1\r\nHost: a\r\n\tfolded\r\n\r\n'), /^400 HPE_INVALID_HEADER_TOKEN: obs-fold/);
  t.regex(reason('CONNECT a:1 HTTP/1.1\r\n Host: a\r\n\r\n'), /^400 HPE_INVALID_HEADER_TOKEN: whitespace after the request line/);
  t.regex(reason('CONNECT a:1 HTTP/1.1\r\nHost: a\rb\r\n\r\n'), /^400 HPE_LF_EXPECTED: a bare CR/);
  t.regex(reason('CONNECT a:1 HTTP/1.1\rHost: a\r\n\r\n'), /^400 HPE_LF_EXPECTED: a bare CR/);
  t.regex(reason('CONNECT a:1 HTTP/1.1\r\nHost: a\r\n\r'), /^more$/);
  t.regex(reason('CONNECT a:1 HTTP/1.1\r\nHost: a\r\n\rX'), /^400 HPE_LF_EXPECTED/);
});
