/**
 * A connected pair of Unix sockets in a directory of their own, for tests of
 * what reads a connection's first bytes; both ends and the directory go at teardown.
 */
import type { ExecutionContext } from 'ava';
import { once } from 'node:events';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

/** [server side (allowHalfOpen), client side]; the client's errors are ignored (tests reset it on purpose). */
export async function unixSocketPair(t: ExecutionContext): Promise<[net.Socket, net.Socket]> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kanal-pair-'));
  const file = path.join(dir, 's');
  const server = net.createServer({ allowHalfOpen: true });
  const accepted = once(server, 'connection') as Promise<[net.Socket]>;
  await new Promise<void>((resolve) => server.listen(file, resolve));
  const client = net.connect(file);
  client.on('error', () => undefined);
  const [socket] = await accepted;
  server.close();
  t.teardown(() => {
    socket.destroy();
    client.destroy();
    fs.rmSync(dir, { recursive: true, force: true });
  });
  return [socket, client];
}
