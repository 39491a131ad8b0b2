/**
 * The health and admin ports' limits (src/common/http-listener.ts), as a
 * caller who wants the process to hold things does it: connections past the
 * cap are closed at once (and one peer address gets a quarter of it), a
 * caller that asks for a large answer and never reads is cut after the idle
 * timeout, and one that sends no request too; a caller that reads is served
 * meanwhile. /readyz gives its detail to loopback callers.
 */
import test from 'ava';
import net from 'node:net';
import http from 'node:http';
import { once } from 'node:events';
import { startHttpListener, sendText, type HttpPortRefusal } from '../../src/common/http-listener.js';
import { startHealthServer } from '../../src/common/health-server.js';
import { captureLogger } from '../helpers/memory-stream.js';

const BIG = Buffer.alloc(64 * 1024 * 1024, 'x');

async function listener(t: import('ava').ExecutionContext, limits: { maxConnections: number; idleTimeoutMs: number }) {
  const refused: HttpPortRefusal[] = [];
  const waiters: (() => void)[] = [];
  const l = await startHttpListener(
    {
      host: '127.0.0.1',
      port: 0,
      name: 'test',
      log: captureLogger().log,
      limits,
      onRefusal: (r) => (refused.push(r), waiters.splice(0).forEach((w) => w())),
    },
    ({ path }, res) => (path === '/big' ? res.writeHead(200).end(BIG) : sendText(res, 200, 'ok\n')),
  );
  t.teardown(() => l.close());
  const refusal = async (reason: HttpPortRefusal, n = 1): Promise<void> => {
    while (refused.filter((r) => r === reason).length < n) await new Promise<void>((resolve) => waiters.push(resolve));
  };
  return { port: l.port, refused, refusal };
}

function connect(port: number, localAddress = '127.0.0.1'): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ port, host: '127.0.0.1', localAddress }, () => resolve(s));
    s.once('error', reject);
  });
}

function get(port: number, path: string, localAddress = '127.0.0.1'): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    http
      .get({ host: '127.0.0.1', port, path, localAddress, agent: false }, (res) => {
        let body = '';
        res.on('data', (c: Buffer) => (body += c.toString()));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      })
      .on('error', reject);
  });
}

test("connections past the cap, or past a peer address's quarter of it, are closed at once; others are served", async (t) => {
  const { port, refused, refusal } = await listener(t, { maxConnections: 8, idleTimeoutMs: 60_000 });
  const held: net.Socket[] = [];
  t.teardown(() => held.forEach((s) => s.destroy()));
  // 127.0.0.1 may hold 2 (8 / 4): the third is closed without an answer.
  for (let i = 0; i < 2; i++) held.push(await connect(port));
  const third = await connect(port);
  third.on('error', () => undefined);
  third.write('GET / HTTP/1.1\r\nHost: x\r\n\r\n');
  let answered = '';
  third.on('data', (c: Buffer) => (answered += c.toString()));
  await once(third, 'close');
  t.is(answered, '', 'no answer on a refused connection');
  await refusal('http_port_full');
  // Other peer addresses fill the rest of the cap; each is served.
  for (let i = 2; i <= 7; i++) {
    const addr = `127.0.0.${i}`;
    t.is((await get(port, '/', addr)).status, 200, `served from ${addr}`);
    held.push(await connect(port, addr));
  }
  t.is(refused.length, 1);
  // 8 held now: the next is refused whoever it is from.
  const over = await connect(port, '127.0.0.9');
  over.on('error', () => undefined);
  await once(over, 'close');
  await refusal('http_port_full', 2);
});

test('a caller that asks for a large answer and never reads is cut after the idle timeout; a reader is served meanwhile', async (t) => {
  const { port, refusal } = await listener(t, { maxConnections: 32, idleTimeoutMs: 500 });
  const s = await connect(port);
  s.on('error', () => undefined);
  s.write('GET /big HTTP/1.1\r\nHost: x\r\n\r\n');
  s.pause();
  t.is((await get(port, '/', '127.0.0.2')).status, 200, 'another caller is served while the answer waits');
  await refusal('http_port_idle');
  // Read now: what the kernel held arrives, then the end — well short of the answer.
  let got = 0;
  s.on('data', (c: Buffer) => (got += c.length));
  s.resume();
  await once(s, 'close');
  t.true(got < BIG.length, `${got} bytes of ${BIG.length} before the server cut it`);
});

test('a connection that sends no request is closed after the idle timeout', async (t) => {
  const { port, refusal } = await listener(t, { maxConnections: 32, idleTimeoutMs: 300 });
  const s = await connect(port);
  s.on('error', () => undefined);
  s.write('GET / HTTP/1.1\r\n'); // a head never finished
  await Promise.all([once(s, 'close'), refusal('http_port_idle')]);
  t.pass();
});

test('/readyz gives its detail and answers ?tenant= for a loopback caller', async (t) => {
  const asked: string[] = [];
  const h = await startHealthServer({
    host: '127.0.0.1',
    port: 0,
    readiness: (q) => (
      asked.push(q.toString()),
      { ready: true, detail: `tenant alpha: 3 agent(s) connected${q.get('tenant') ? ` (${q.get('tenant')})` : ''}` }
    ),
    log: captureLogger().log,
  });
  t.teardown(() => h.close());
  const r = await get(h.port, '/readyz?tenant=alpha');
  t.is(r.status, 200);
  t.is(r.body, 'ok: tenant alpha: 3 agent(s) connected (alpha)\n');
  t.deepEqual(asked, ['tenant=alpha']);
});
