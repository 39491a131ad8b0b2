/**
 * Child processes and temporary directories of one bench run, on the kit's
 * launcher (kit/launch/child.ts). Every child is started through
 * `bash -c 'ulimit -n <hard>; exec node …'` (Node 20 has no setrlimit) so its
 * pid is the node (or upstream's) process itself; each is stopped by pid on
 * the way out, including on failure, SIGINT and SIGTERM.
 */
import { Child } from '../kit/launch/child.js';
import { CleanupStack, scopedTempDir } from '../kit/launch/cleanup-scope.js';

export { Child };

interface CommonSpawnOptions {
  /** Short name used in error messages. */
  name: string;
  args?: string[];
  /** stdout and stderr go here. */
  logFile: string;
  /** Open an IPC channel (for bench workers). */
  ipc?: boolean;
}

/** A Node script run by this Node, or another executable (upstream's Go binaries). */
export type SpawnOptions = CommonSpawnOptions &
  (
    | {
        script: string;
        /** Node flags placed before the script (e.g. --cpu-prof). */
        nodeArgs?: string[];
      }
    | { executable: string }
  );

/** Children still running. */
const live = new Set<Child>();
/** The run's temporary directories (children are stopped by cleanUp() first, with its grace). */
const dirs = new CleanupStack();
let handlersInstalled = false;

/** SIGINT, SIGTERM, SIGHUP stop every child and remove every directory; kit/launch/exit-cleanup.ts covers a plain exit. */
function installHandlers(): void {
  if (handlersInstalled) return;
  handlersInstalled = true;
  for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
    process.once(signal, () => {
      process.stderr.write(`\nbench: ${signal}, stopping ${live.size} child process(es) and removing temporary files\n`);
      // Fire and forget: the handler cannot wait, and the exit in finally() ends the process whether or not cleanUp() failed.
      void cleanUp(1000).finally(() => process.exit(130));
    });
  }
}

const RAISE_OPEN_FILES = 'h=$(ulimit -Hn); ulimit -n "$h" 2>/dev/null || ulimit -n 65536 2>/dev/null; exec "$@"';

export function spawnChild(opts: SpawnOptions): Child {
  installHandlers();
  const program = 'executable' in opts ? [opts.executable] : [process.execPath, ...(opts.nodeArgs ?? []), opts.script];
  const child = new Child({
    name: opts.name,
    argv: [...program, ...(opts.args ?? [])],
    wrapper: ['bash', '-c', RAISE_OPEN_FILES, 'kanal-bench'],
    logFile: opts.logFile,
    ipc: opts.ipc,
  });
  live.add(child);
  void child.exited.then(() => live.delete(child));
  return child;
}

export function makeTempDir(prefix: string): string {
  installHandlers();
  return scopedTempDir(dirs, prefix);
}

/** Stops every live child (by pid, SIGKILL after graceMs) and removes every temporary directory. */
export async function cleanUp(graceMs = 5000): Promise<void> {
  await Promise.all([...live].map((c) => c.stop('SIGTERM', graceMs)));
  await dirs.run();
}

export function liveChildren(): number {
  return live.size;
}
