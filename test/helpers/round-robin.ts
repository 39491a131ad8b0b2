/** A round-robin TCP balancer on 127.0.0.1 for servers behind one address (HA tests). */
import net from 'node:net';
import type { Scope } from './kanal-processes.js';

/** Round-robin TCP pass-through to `ports` on 127.0.0.1 (a stand-in for a load balancer). */
export async function roundRobin(scope: Scope, ports: () => number[]): Promise<number> {
  let next = 0;
  const sockets = new Set<net.Socket>();
  const lb = net.createServer((client) => {
    const choices = ports();
    const port = choices[next++ % choices.length];
    const upstream = net.connect({ host: '127.0.0.1', port });
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.once('close', () => sockets.delete(s));
      s.on('error', () => {
        client.destroy();
        upstream.destroy();
      });
    }
    client.pipe(upstream).pipe(client);
  });
  await new Promise<void>((resolve) => lb.listen(0, '127.0.0.1', () => resolve()));
  scope.teardown(async () => {
    for (const s of sockets) s.destroy();
    await new Promise<void>((resolve) => lb.close(() => resolve()));
  });
  return (lb.address() as net.AddressInfo).port;
}
