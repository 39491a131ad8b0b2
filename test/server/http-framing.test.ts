/**
 * The forward proxy's message framing (http-framing.ts, body-framing.ts),
 * hop-by-hop fields, Proxy-Authorization and absolute URIs: bytes in,
 * payload and verdicts out, split at every byte where it matters.
 */
import test from 'ava';
import { BodyReader, type BodyFraming } from '../../src/server/frontends/http-framing.js';
import { requestFraming, responseFraming } from '../../src/server/frontends/body-framing.js';
import { endToEnd, wantsClose } from '../../src/server/frontends/hop-by-hop.js';
import { proxyToken } from '../../src/server/frontends/proxy-authorization.js';
import { forwardTarget } from '../../src/server/frontends/absolute-uri.js';
import { ResponseHeadParser } from '../../src/server/frontends/response-head.js';
import type { HeaderLine } from '../../src/server/frontends/request-head.js';

function h(...pairs: [string, string][]): HeaderLine[] {
  return pairs.map(([name, value]) => ({ name, value }));
}

/** Reads `input` fed in pieces of `size` bytes: the payload, the rest, and the verdict. */
function read(framing: BodyFraming, input: string, size = input.length): { payload: string; rest: string; done: boolean; bad?: string } {
  const r = new BodyReader(framing);
  const buf = Buffer.from(input, 'latin1');
  let payload = '';
  let rest = '';
  for (let i = 0; i < buf.length; i += size) {
    const out = r.push(buf.subarray(i, i + size));
    payload += Buffer.concat(out.payload).toString('latin1');
    if (out.bad) return { payload, rest, done: false, bad: out.bad };
    if (out.done) {
      rest = Buffer.concat([out.rest, buf.subarray(i + size)]).toString('latin1');
      return { payload, rest, done: true };
    }
  }
  return { payload, rest, done: r.done };
}

test('Content-Length bodies end at their length; what follows is the next message', (t) => {
  for (const size of [1, 3, 100]) {
    const r = read({ kind: 'length', length: 5 }, 'helloGET / HTTP/1.1', size);
    t.deepEqual(r, { payload: 'hello', rest: 'GET / HTTP/1.1', done: true }, `pieces of ${size}`);
  }
  t.true(new BodyReader({ kind: 'length', length: 0 }).done);
  t.true(new BodyReader({ kind: 'none' }).done);
});

test('chunked bodies: sizes in hex, extensions and trailers dropped, split anywhere', (t) => {
  const body = '5;name=value\r\nhello\r\nA\r\n0123456789\r\n0\r\nX-Trailer: 1\r\n\r\nNEXT';
  for (const size of [1, 2, 7, body.length]) {
    t.deepEqual(read({ kind: 'chunked' }, body, size), { payload: 'hello0123456789', rest: 'NEXT', done: true }, `pieces of ${size}`);
  }
  t.deepEqual(read({ kind: 'chunked' }, '0\r\n\r\n'), { payload: '', rest: '', done: true });
});

test('chunked bodies: every malformed chunk is refused', (t) => {
  const cases: [string, RegExp][] = [
    ['x\r\n', /without hex digits/],
    ['\r\n', /without hex digits/],
    ['5\nhello\r\n0\r\n\r\n', /invalid character in chunk size/],
    ['5\r\nhello\n0\r\n\r\n', /expected CRLF/],
    ['5\r\nhelloX\r\n', /longer than its size/],
    ['FFFFFFFFFFFFFF\r\n', /more than 13 hex digits/],
    ['1;a\x01\r\n', /chunk extension/],
    ['0\r\n foo\r\n\r\n', /obs-fold/],
    ['0\r\nA: b\rc\r\n\r\n', /bare CR/],
    [`1;${'a'.repeat(5000)}\r\n`, /chunk-size line longer/],
  ];
  for (const [input, reason] of cases) {
    const r = read({ kind: 'chunked' }, input);
    t.regex(r.bad ?? '', reason, JSON.stringify(input.slice(0, 30)));
  }
  const trailers = `0\r\n${'X-A: b\r\n'.repeat(3000)}\r\n`;
  t.regex(read({ kind: 'chunked' }, trailers).bad ?? '', /trailer section larger/);
});

test('a close-delimited body runs to the end; any other cut short is refused', (t) => {
  const r = new BodyReader({ kind: 'close' });
  t.is(Buffer.concat(r.push(Buffer.from('abc')).payload).toString(), 'abc');
  t.true(r.end().done);
  const cut = new BodyReader({ kind: 'length', length: 10 });
  cut.push(Buffer.from('abc'));
  t.regex(cut.end().bad ?? '', /ended before/);
  const chunked = new BodyReader({ kind: 'chunked' });
  chunked.push(Buffer.from('5\r\nab'));
  t.false(chunked.end().done);
});

test('request framing: the smuggler ambiguities are refused (RFC 9112 section 6.3)', (t) => {
  const ok = (v: ReturnType<typeof requestFraming>): BodyFraming | undefined => (v.ok ? v.framing : undefined);
  t.deepEqual(ok(requestFraming('HTTP/1.1', h(['Content-Length', '12']))), { kind: 'length', length: 12 });
  t.deepEqual(ok(requestFraming('HTTP/1.1', h(['Content-Length', '12'], ['content-length', '12']))), { kind: 'length', length: 12 });
  t.deepEqual(ok(requestFraming('HTTP/1.1', h(['Content-Length', '12, 12']))), { kind: 'length', length: 12 });
  t.deepEqual(ok(requestFraming('HTTP/1.1', h(['Transfer-Encoding', 'Chunked']))), { kind: 'chunked' });
  t.deepEqual(ok(requestFraming('HTTP/1.1', [])), { kind: 'none' });
  const refused: [HeaderLine[], 400 | 501 | 502, RegExp, 'HTTP/1.0' | 'HTTP/1.1'][] = [
    [h(['Content-Length', '5'], ['Transfer-Encoding', 'chunked']), 400, /both Transfer-Encoding and Content-Length/, 'HTTP/1.1'],
    [h(['Content-Length', '5'], ['Content-Length', '6']), 400, /differing Content-Length/, 'HTTP/1.1'],
    [h(['Content-Length', '5, 6']), 400, /differing Content-Length/, 'HTTP/1.1'],
    [h(['Content-Length', '-1']), 400, /not a number/, 'HTTP/1.1'],
    [h(['Content-Length', '+5']), 400, /not a number/, 'HTTP/1.1'],
    [h(['Transfer-Encoding', 'gzip, chunked']), 501, /not implemented/, 'HTTP/1.1'],
    [h(['Transfer-Encoding', 'chunked'], ['Transfer-Encoding', 'gzip']), 400, /must end in chunked/, 'HTTP/1.1'],
    [h(['Transfer-Encoding', 'chunked, identity']), 400, /must end in chunked/, 'HTTP/1.1'],
    [h(['Transfer-Encoding', ' xchunked']), 400, /must end in chunked/, 'HTTP/1.1'],
    [h(['Transfer-Encoding', '']), 400, /must end in chunked/, 'HTTP/1.1'],
    [h(['Transfer-Encoding', 'chunked']), 400, /HTTP\/1\.0/, 'HTTP/1.0'],
  ];
  for (const [headers, status, reason, version] of refused) {
    const v = requestFraming(version, headers);
    t.false(v.ok, JSON.stringify(headers));
    if (!v.ok) {
      t.is(v.status, status, JSON.stringify(headers));
      t.regex(v.reason, reason);
    }
  }
});

test('response framing: HEAD, 1xx, 204 and 304 have no body; no length runs to the close; both is a bad gateway', (t) => {
  const framing = (method: string, status: number, headers: HeaderLine[]): string => {
    const v = responseFraming(method, status, headers);
    return v.ok ? v.framing.kind : `bad ${v.status}`;
  };
  t.is(framing('HEAD', 200, h(['Content-Length', '99'])), 'none');
  t.is(framing('GET', 204, []), 'none');
  t.is(framing('GET', 304, h(['Content-Length', '99'])), 'none');
  t.is(framing('GET', 100, []), 'none');
  t.is(framing('GET', 200, h(['Content-Length', '99'])), 'length');
  t.is(framing('GET', 200, h(['Transfer-Encoding', 'chunked'])), 'chunked');
  t.is(framing('GET', 200, h(['Transfer-Encoding', 'gzip'])), 'close');
  t.is(framing('GET', 200, []), 'close');
  t.is(framing('GET', 200, h(['Transfer-Encoding', 'chunked'], ['Content-Length', '5'])), 'bad 502');
  t.is(framing('GET', 200, h(['Content-Length', '5'], ['Content-Length', '7'])), 'bad 502');
});

test('hop-by-hop fields go, with those Connection names; close as the version says', (t) => {
  const kept = endToEnd(
    h(
      ['Connection', 'keep-alive, X-Secret'],
      ['X-Secret', 'drop me'],
      ['Keep-Alive', 'timeout=5'],
      ['Proxy-Connection', 'keep-alive'],
      ['TE', 'trailers'],
      ['Transfer-Encoding', 'chunked'],
      ['Upgrade', 'h2c'],
      ['Proxy-Authorization', 'Bearer x'],
      ['Proxy-Authenticate', 'Bearer'],
      ['Trailer', 'X-T'],
      ['Host', 'h'],
      ['Content-Length', '5'],
      ['Accept', '*/*'],
      ['Authorization', 'Bearer for-the-origin'],
    ),
  );
  t.deepEqual(kept, h(['Accept', '*/*'], ['Authorization', 'Bearer for-the-origin']));
  t.false(wantsClose('HTTP/1.1', []));
  t.true(wantsClose('HTTP/1.1', h(['Connection', 'Close'])));
  t.true(wantsClose('HTTP/1.0', h(['Connection', 'keep-alive'])));
});

test('Proxy-Authorization: Bearer, or Basic with the token as the password', (t) => {
  t.deepEqual(proxyToken(h(['Proxy-Authorization', 'Bearer abc.def-ghi'])), { token: 'abc.def-ghi' });
  t.deepEqual(proxyToken(h(['proxy-authorization', 'bearer abc'])), { token: 'abc' });
  const basic = Buffer.from('prometheus:s3cret:with:colons').toString('base64');
  t.deepEqual(proxyToken(h(['Proxy-Authorization', `Basic ${basic}`])), { token: 's3cret:with:colons' });
  t.deepEqual(proxyToken([]), {});
  t.regex(proxyToken(h(['Proxy-Authorization', 'Digest x=y'])).problem ?? '', /not supported/);
  t.regex(proxyToken(h(['Proxy-Authorization', 'Bearer'])).problem ?? '', /without credentials/);
  t.regex(proxyToken(h(['Proxy-Authorization', `Basic ${Buffer.from('user').toString('base64')}`])).problem ?? '', /password/);
  t.regex(proxyToken(h(['Proxy-Authorization', 'Bearer a b'])).problem ?? '', /token68/);
  t.regex(proxyToken(h(['Proxy-Authorization', 'Bearer a'], ['Proxy-Authorization', 'Bearer b'])).problem ?? '', /more than one/);
});

test('absolute URIs: http:// only, the authority as written, port 80 by default', (t) => {
  const target = (uri: string): unknown => {
    const v = forwardTarget(uri);
    return v.ok ? v.target : v.reason;
  };
  t.deepEqual(target('http://10.0.0.5:9100/metrics'), { address: '10.0.0.5:9100', authority: '10.0.0.5:9100', path: '/metrics' });
  t.deepEqual(target('HTTP://Example.com'), { address: 'Example.com:80', authority: 'Example.com', path: '/' });
  t.deepEqual(target('http://h:/x?y'), { address: 'h:80', authority: 'h:', path: '/x?y' });
  t.deepEqual(target('http://h?q=1'), { address: 'h:80', authority: 'h', path: '/?q=1' });
  t.deepEqual(target('http://[::1]:8080/a'), { address: '[::1]:8080', authority: '[::1]:8080', path: '/a' });
  t.regex(String(target('https://h/')), /CONNECT/);
  t.regex(String(target('ftp://h/')), /not an http:\/\/ URI/);
  t.regex(String(target('http://user:pw@h/')), /Proxy-Authorization/);
  t.regex(String(target('http://h/#frag')), /fragment/);
  t.regex(String(target('http://h:99999/')), /port/);
  t.regex(String(target('http:///x')), /no host/);
  t.regex(String(target('http://bad_host!/')), /neither/);
});

test('response heads: strict status line and fields, bounded', (t) => {
  const p = new ResponseHeadParser(1024);
  t.is(p.push(Buffer.from('HTTP/1.1 200 OK\r\nContent-')).kind, 'more');
  const v = p.push(Buffer.from('Length: 2\r\nX: y \r\n\r\nhi'));
  t.is(v.kind, 'head');
  if (v.kind === 'head') {
    t.is(v.status, 200);
    t.deepEqual(v.headers, h(['Content-Length', '2'], ['X', 'y']));
    t.is(v.rest.toString(), 'hi');
  }
  const bad = (text: string): string => {
    const r = new ResponseHeadParser(1024).push(Buffer.from(text, 'latin1'));
    return r.kind === 'bad' ? r.reason : r.kind;
  };
  t.regex(bad('HTTP/1.1 200 OK\r\nA: b\r\n c\r\n\r\n'), /obs-fold/);
  t.regex(bad('HTTP/1.1 200 OK\nA: b\r\n\r\n'), /bare CR or LF/);
  t.regex(bad('HTTP/2 200 OK\r\n\r\n'), /status line/);
  t.regex(bad('HTTP/1.1 200 OK\r\nA b\r\n\r\n'), /field name/);
  t.regex(bad('HTTP/1.1 200 OK\r\nA: \x01\r\n\r\n'), /invalid character/);
  t.regex(bad(`HTTP/1.1 200 OK\r\nA: ${'x'.repeat(2000)}`), /larger than 1024/);
  t.regex(new ResponseHeadParser(1024).end().kind, /bad/);
});
