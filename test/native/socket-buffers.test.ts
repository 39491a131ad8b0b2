/**
 * Tunnel sockets' send buffers (native/socket-buffers.ts through
 * src/transport/socket-send-buffer.ts): sized to hold what the peer's stream
 * window allows in flight, so Node's HTTP/2 never waits on a write with
 * reading stopped. Real loopback sockets, plain and TLS.
 */
import test from 'ava';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import { growSendBuffer, sendBufferBytes, setSendBuffer, socketFd } from '../../native/socket-buffers.js';
import {
  sizeTunnelSendBuffer,
  sizeUnixFrontendSendBuffer,
  TUNNEL_SEND_BUFFER_BYTES,
  UNIX_FRONTEND_SEND_BUFFER_BYTES,
} from '../../src/transport/socket-send-buffer.js';
import { writeThrowawayPki } from '../../kit/pki/throwaway-pki.js';

const canForce = process.getuid?.() === 0;
const wmemMax = Number(fs.readFileSync('/proc/sys/net/core/wmem_max', 'utf8').trim());

async function loopbackPair(): Promise<{ client: net.Socket; close: () => void }> {
  const server = net.createServer((s) => s.resume());
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
  const client = net.connect((server.address() as net.AddressInfo).port, '127.0.0.1');
  await new Promise<void>((resolve) => client.once('connect', () => resolve()));
  return { client, close: () => (client.destroy(), server.close()) };
}

test('a TCP socket gets the send buffer the tunnel windows need (beyond wmem_max only with CAP_NET_ADMIN)', async (t) => {
  const { client, close } = await loopbackPair();
  t.teardown(close);
  const fd = socketFd(client);
  t.true(fd >= 0, 'the socket has a file descriptor');
  const before = sendBufferBytes(fd);
  const { have, want } = sizeTunnelSendBuffer(client);
  t.log(`send buffer ${before} -> ${have} B (want ${want}, wmem_max ${wmemMax}, root ${canForce})`);
  t.is(want, TUNNEL_SEND_BUFFER_BYTES);
  if (canForce || wmemMax * 2 >= want) t.true(have >= want, `have ${have} B`);
  else t.true(have >= Math.min(before, 2 * wmemMax), `as much as wmem_max allows (${have} B)`);
});

test('a send buffer already large enough is left alone; a closed socket reports -1 and changes nothing', async (t) => {
  const { client, close } = await loopbackPair();
  t.teardown(close);
  const fd = socketFd(client);
  const first = growSendBuffer(fd, 64 * 1024);
  t.true(first >= 64 * 1024);
  t.is(growSendBuffer(fd, 32 * 1024), first, 'a smaller request keeps the larger buffer');
  client.destroy();
  await new Promise((r) => client.once('close', r));
  t.is(socketFd(client), -1);
  t.is(growSendBuffer(socketFd(client), 64 * 1024), -1);
});

test('the descriptor under a TLS socket is found, so both tunnel ends can size theirs', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kanal-sndbuf-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const pki = await writeThrowawayPki(dir, { serverIps: ['127.0.0.1'] });
  const server = tls.createServer({ cert: fs.readFileSync(pki.serverCert), key: fs.readFileSync(pki.serverKey) }, (s) => s.resume());
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
  const client = tls.connect({ port: (server.address() as net.AddressInfo).port, host: '127.0.0.1', ca: fs.readFileSync(pki.caCert) });
  t.teardown(() => (client.destroy(), server.close()));
  await new Promise<void>((resolve) => client.once('secureConnect', () => resolve()));
  const fd = socketFd(client);
  t.true(fd >= 0, `TLS socket fd ${fd}`);
  const { have } = sizeTunnelSendBuffer(client);
  t.is(have, sendBufferBytes(fd));
  t.true(have > 0);
});

test('a frontend Unix socket is sized in one call, and the size it reports is what the kernel accounts', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kanal-sndbuf-'));
  const server = net.createServer((s) => s.resume());
  await new Promise<void>((resolve) => server.listen(path.join(dir, 's'), () => resolve()));
  const client = net.connect(path.join(dir, 's'));
  t.teardown(() => (client.destroy(), server.close(), fs.rmSync(dir, { recursive: true, force: true })));
  await new Promise<void>((resolve) => client.once('connect', () => resolve()));
  const fd = socketFd(client);
  const { have, want } = sizeUnixFrontendSendBuffer(client);
  t.is(want, UNIX_FRONTEND_SEND_BUFFER_BYTES);
  t.is(have, sendBufferBytes(fd));
  if (canForce || wmemMax * 2 >= want) t.true(have >= want, `have ${have} B`);
  // Unlike growSendBuffer, a smaller size is set too.
  t.is(setSendBuffer(fd, 64 * 1024), sendBufferBytes(fd));
  t.true(sendBufferBytes(fd) < have || have <= 64 * 1024);
  t.is(setSendBuffer(-1, 64 * 1024), -1);
});
