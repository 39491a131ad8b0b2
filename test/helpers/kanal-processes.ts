/**
 * The end-to-end kit in one import: the real `kanal` CLI as child processes
 * (kanal-children.ts) in a workspace (workspace.ts), a server with its agents
 * ready (proxy.ts), node-side listeners (node-listener.ts), loopback backends
 * (backends.ts), frontend clients (frontend-clients.ts), byte streams
 * (byte-streams.ts) and probes (probes.ts); launching, log reading and the
 * cleanup scope come from kit/launch/.
 *
 * Every wait is bounded in time; every resource is released through a
 * {@link Scope}: an ava test context (`t.teardown`) or, for fixtures shared by
 * a whole file, its fileScope() (file-scope.ts).
 */
export { CleanupStack, type Scope } from '../../kit/launch/cleanup-scope.js';
export { readLog, logTail, waitForLog, warnLine, levelAtLeast, type LogLine } from '../../kit/launch/log-reader.js';
export type { Child as KanalProcess } from '../../kit/launch/child.js';
export {
  KANAL_CLI as CLI,
  freePort,
  kanalCommand,
  loopbackServerArgs,
  spawnKanal,
  waitHealthy,
  withPortRetry,
} from '../../kit/launch/kanal-cli.js';
export { connectUnix, httpConnect } from '../../kit/demo/proxy-client.js';
export * from './workspace.js';
export * from './kanal-children.js';
export * from './proxy.js';
export * from './node-listener.js';
export * from './file-scope.js';
export * from './probes.js';
export * from './backends.js';
export * from './byte-streams.js';
export * from './frontend-clients.js';
