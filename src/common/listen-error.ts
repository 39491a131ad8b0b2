/**
 * A listener that cannot start, said so that an operator knows which flag to
 * change (a bare "listen EADDRINUSE" named neither).
 */
export class ListenError extends Error {
  override name = 'ListenError';
}

const CAUSES: Record<string, string> = {
  EADDRINUSE: 'the address is already in use (another process listens there: stop it or choose another port)',
  EADDRNOTAVAIL: 'no interface of this host has that address',
  EACCES: 'permission denied (ports below 1024 need root or CAP_NET_BIND_SERVICE)',
};

/** `err` from listen() on `address`, which the flags `flags` (e.g. "--agent-bind-address, --agent-port") configure. */
export function listenError(err: unknown, address: string, flags: string): Error {
  if (!(err instanceof Error)) return new ListenError(`cannot listen on ${address} (${flags}): ${String(err)}`);
  const code = (err as NodeJS.ErrnoException).code;
  const cause = code && CAUSES[code] ? `${CAUSES[code]}; ${code}` : err.message;
  return new ListenError(`cannot listen on ${address} (${flags}): ${cause}`);
}
