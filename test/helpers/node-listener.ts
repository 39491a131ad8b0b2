/**
 * A node -> control plane listener of a `kanal agent` on a loopback address
 * of its own (127.0.0.2, 127.0.0.3, ...): the agent flags that open it
 * (no interface to create, one --target) and a client of it. Its own address
 * keeps its port apart from the server's and the backends' on 127.0.0.1.
 */
import net from 'node:net';
import { freePort } from '../../kit/launch/kanal-cli.js';

export interface NodeListener {
  host: string;
  port: number;
  /** `kanal agent` flags: listen on host:port, forward to the destination. */
  args: string[];
  /** A TCP connection to the listener, once connected. */
  connect(): Promise<net.Socket>;
}

export async function nodeListener(opts: { host: string; destination: string }): Promise<NodeListener> {
  const { host, destination } = opts;
  const port = await freePort(host);
  return {
    host,
    port,
    args: ['--bind-address', host, '--bind-interface-type', 'none', '--target', `${port}:${destination}`],
    connect: () =>
      new Promise<net.Socket>((resolve, reject) => {
        const c = net.connect({ host, port });
        c.once('connect', () => resolve(c));
        // Kept after the connect: a reset later (the agent stopping) must not throw.
        c.on('error', reject);
      }),
  };
}
