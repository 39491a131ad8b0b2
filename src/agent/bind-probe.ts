/**
 * Whether this host can listen on an address: the question
 * `--bind-interface-type none` really asks. Listing interfaces is not the
 * same: 127.0.0.2 is on no interface, yet usable through lo's 127.0.0.0/8.
 */
import net from 'node:net';

// The settings these messages name, spelt once here for the modules the agent's table imports (src/agent/settings.ts): they cannot import it back.
export const BIND_ADDRESS = '--bind-address';
export const BIND_INTERFACE_TYPE = '--bind-interface-type';

/** undefined when a listener can bind `address` (port 0), else why not (e.g. "EADDRNOTAVAIL"). */
export function bindProblem(address: string): Promise<string | undefined> {
  return new Promise((resolve) => {
    const server = net.createServer();
    server.once('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? err.message));
    server.listen({ host: address, port: 0 }, () => server.close(() => resolve(undefined)));
  });
}

export function describeBindProblem(address: string, code: string): string {
  return code === 'EADDRNOTAVAIL'
    ? `${address} is not an address of this host (EADDRNOTAVAIL), and ${BIND_INTERFACE_TYPE} none means the agent does not add it`
    : `cannot listen on ${address} (${code})`;
}
