/**
 * The front doors a frontend listener knows, in the order they are asked
 * about a connection's first bytes (frontend.ts): a door that claims
 * everything (HTTP CONNECT answers what is not HTTP/1.x with a 400) comes
 * last. A new door is its module and one line here; `--mode` takes its name.
 */
import type { Frontend } from './frontend.js';
import { grpcFrontend } from './grpc-frontend.js';
import { httpConnectFrontend } from './http-connect-frontend.js';

export const FRONTENDS = [grpcFrontend, httpConnectFrontend] as const satisfies readonly Frontend[];

export type FrontendName = (typeof FRONTENDS)[number]['name'];

/** `--mode`: which front doors a listener serves; the first is the default (every door, told apart by their first bytes). */
export const FRONTEND_MODES: readonly ['both', ...FrontendName[]] = ['both', ...FRONTENDS.map((f) => f.name)];

export type FrontendMode = (typeof FRONTEND_MODES)[number];

/** The doors each mode serves, made once (a listener asks per connection). */
const SERVED: ReadonlyMap<FrontendMode, ReadonlySet<string>> = new Map(
  FRONTEND_MODES.map((mode) => [mode, new Set(mode === 'both' ? FRONTENDS.map((f) => f.name) : [mode])]),
);

/** The doors `mode` serves. */
export function frontendsServed(mode: FrontendMode): ReadonlySet<string> {
  return SERVED.get(mode) ?? new Set();
}
