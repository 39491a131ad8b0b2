/**
 * The front doors a frontend listener knows, in the order they are asked
 * about a connection's first bytes (frontend.ts): a door that claims
 * everything (HTTP CONNECT answers what is not HTTP/1.x with a 400) comes
 * last. A new door is its module and one line here; `--mode` takes its name.
 */
import type { Frontend } from './frontend.js';
import { grpcFrontend } from './grpc-frontend.js';
import { httpConnectFrontend } from './http-connect-frontend.js';
import { socks5Frontend } from './socks5-frontend.js';

export const FRONTENDS = [grpcFrontend, socks5Frontend, httpConnectFrontend] as const satisfies readonly Frontend[];

export type FrontendName = (typeof FRONTENDS)[number]['name'];

/** `--mode`: which front doors a listener serves; the first is the default. */
export const FRONTEND_MODES: readonly ['both', ...FrontendName[]] = ['both', ...FRONTENDS.map((f) => f.name)];

export type FrontendMode = (typeof FRONTEND_MODES)[number];

/**
 * What `both` serves: the kube-apiserver's two doors, told apart by their first bytes. SOCKS5 is
 * served only where asked for (`--mode socks5`, or its own listener), so the KAS's listener stays as it was.
 */
const BOTH: readonly FrontendName[] = [grpcFrontend.name, httpConnectFrontend.name];

/** The doors each mode serves, made once (a listener asks per connection). */
const SERVED: ReadonlyMap<FrontendMode, ReadonlySet<string>> = new Map(
  FRONTEND_MODES.map((mode) => [mode, new Set<string>(mode === 'both' ? BOTH : [mode])]),
);

/** The doors `mode` serves. */
export function frontendsServed(mode: FrontendMode): ReadonlySet<string> {
  return SERVED.get(mode) ?? new Set();
}

/**
 * The doors a listener of `mode` asks about a connection's first bytes: `both` asks only its own,
 * so bytes of a door it does not serve (SOCKS5's 0x05) reach HTTP CONNECT and get its 400, as
 * before SOCKS5 existed; a single door's mode asks all, so a refusal can name the door that was meant.
 */
export function frontendsSniffed(mode: FrontendMode): readonly Frontend[] {
  return SNIFFED.get(mode) ?? FRONTENDS;
}

const SNIFFED: ReadonlyMap<FrontendMode, readonly Frontend[]> = new Map(
  FRONTEND_MODES.map((mode) => [mode, mode === 'both' ? FRONTENDS.filter((f) => BOTH.includes(f.name)) : FRONTENDS]),
);
