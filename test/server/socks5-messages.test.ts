/** The SOCKS5 head parsers (RFC 1928 sections 3 and 4, RFC 1929): every prefix waits, each malformed field gets its reply. */
import test from 'ava';
import { parseGreeting, parseRequest, parseUserPass, type SocksParse } from '../../src/server/frontends/socks5-messages.js';
import { REP_FOR_FAILURE, socksReply, SocksRep } from '../../src/server/frontends/socks5-reply-codes.js';
import { DIAL_FAILURES } from '../../src/domain/dial-result.js';
import { connectRequest, userPassMessage } from '../helpers/socks5-client.js';

function prefixesWait<T>(t: { is(a: unknown, b: unknown, m?: string): void }, parse: (b: Buffer) => SocksParse<T>, whole: Buffer): void {
  for (let n = 0; n < whole.length; n++) t.is(parse(whole.subarray(0, n)).kind, 'more', `prefix of ${n} bytes`);
}

function badOf<T>(p: SocksParse<T>): { code: string; reply: string } | undefined {
  return p.kind === 'bad' ? { code: p.code, reply: p.reply.toString('hex') } : undefined;
}

const rep = (code: number): string => socksReply(code as (typeof SocksRep)[keyof typeof SocksRep]).toString('hex');

test('greeting: every prefix waits; the methods and the bytes used come out; trailing bytes are left', (t) => {
  const g = Buffer.from([5, 2, 0, 2]);
  prefixesWait(t, parseGreeting, g);
  const p = parseGreeting(Buffer.concat([g, Buffer.from([1, 2, 3])]));
  t.is(p.kind, 'done');
  if (p.kind !== 'done') return;
  t.deepEqual([...p.value.methods], [0, 2]);
  t.is(p.used, 4);
  const all = parseGreeting(Buffer.from([5, 255, ...Array.from({ length: 255 }, (_, i) => i)]));
  t.is(all.kind === 'done' ? all.value.methods.size : 0, 255);
});

test('greeting: another version or no method at all is "no acceptable methods"', (t) => {
  t.deepEqual(badOf(parseGreeting(Buffer.from([4, 1, 0]))), { code: 'greeting_version', reply: '05ff' });
  t.deepEqual(badOf(parseGreeting(Buffer.from([5, 0]))), { code: 'greeting_no_methods', reply: '05ff' });
});

test('username/password: every prefix waits; empty fields are taken; another version fails with status 1', (t) => {
  const m = userPassMessage('alice', 'tok');
  prefixesWait(t, parseUserPass, m);
  t.like(parseUserPass(m), { kind: 'done', value: { username: 'alice', password: 'tok' }, used: m.length });
  t.like(parseUserPass(userPassMessage('', '')), { kind: 'done', value: { username: '', password: '' }, used: 3 });
  const long = userPassMessage('u'.repeat(255), 'p'.repeat(255));
  t.like(parseUserPass(long), { kind: 'done', used: 513 });
  t.deepEqual(badOf(parseUserPass(Buffer.from([5, 1, 0x61, 0]))), { code: 'auth_version', reply: '0101' });
});

test('request: IPv4, IPv6 and domain names become host:port; a name stays a name', (t) => {
  for (const [host, port, address, addressType] of [
    ['10.1.2.3', 9100, '10.1.2.3:9100', 'ipv4'],
    ['::1', 443, '[::1]:443', 'ipv6'],
    ['fd00::a:b', 80, '[fd00::a:b]:80', 'ipv6'],
    ['node-exporter.monitoring.svc', 9100, 'node-exporter.monitoring.svc:9100', 'domain'],
  ] as const) {
    const r = connectRequest(host, port);
    prefixesWait(t, parseRequest, r);
    t.like(parseRequest(r), { kind: 'done', value: { address, addressType }, used: r.length }, host);
  }
  // Some clients send an IP literal as a name.
  const v6name = Buffer.concat([Buffer.from([5, 1, 0, 3, 3]), Buffer.from('::1'), Buffer.from([0, 80])]);
  t.like(parseRequest(v6name), { kind: 'done', value: { address: '[::1]:80', addressType: 'domain' } });
});

test('request: each malformed field gets its reply code', (t) => {
  const ok = connectRequest('10.0.0.1', 80);
  const with_ = (i: number, v: number): Buffer => {
    const b = Buffer.from(ok);
    b[i] = v;
    return b;
  };
  const name = (n: string, port = 80): Buffer =>
    Buffer.concat([
      Buffer.from([5, 1, 0, 3, Buffer.byteLength(n, 'latin1')]),
      Buffer.from(n, 'latin1'),
      Buffer.from([port >> 8, port & 255]),
    ]);
  for (const [bytes, code, reply] of [
    [with_(0, 4), 'request_version', rep(SocksRep.generalFailure)],
    [with_(1, 2), 'request_command', rep(SocksRep.commandNotSupported)], // BIND
    [with_(1, 3), 'request_command', rep(SocksRep.commandNotSupported)], // UDP ASSOCIATE
    [with_(1, 9), 'request_command', rep(SocksRep.commandNotSupported)],
    [with_(2, 1), 'request_reserved', rep(SocksRep.generalFailure)],
    [with_(3, 5), 'request_address_type', rep(SocksRep.addressTypeNotSupported)],
    [Buffer.from([5, 1, 0, 3, 0, 0, 80]), 'request_domain_length', rep(SocksRep.generalFailure)],
    [name('a b.example'), 'request_domain', rep(SocksRep.hostUnreachable)],
    [name('evil\r\nname'), 'request_domain', rep(SocksRep.hostUnreachable)],
    [name('x:1'), 'request_domain', rep(SocksRep.hostUnreachable)],
    [name('a'.repeat(255)), 'request_domain', rep(SocksRep.hostUnreachable)],
    [connectRequest('10.0.0.1', 0), 'request_port', rep(SocksRep.generalFailure)],
  ] as const) {
    t.deepEqual(badOf(parseRequest(bytes)), { code, reply }, `${bytes.toString('hex')}`);
  }
  // The command is refused at its byte: nothing more need come.
  t.is(parseRequest(Buffer.from([5, 2])).kind, 'bad');
  t.is(parseRequest(Buffer.from([5, 1, 0, 7])).kind, 'bad');
});

test('reply codes: the dial failures map as docs/frontends.md says', (t) => {
  t.deepEqual(Object.fromEntries(DIAL_FAILURES.map((f) => [f, REP_FOR_FAILURE[f]])), {
    'no-backend': 3,
    refused: 5,
    exhausted: 1,
    timeout: 6,
    cancelled: 1,
    'tunnel-closed': 1,
    forbidden: 2,
    unresolved: 4,
  });
  t.is(socksReply(SocksRep.succeeded).toString('hex'), '05000001000000000000');
});
