/**
 * Child processes and temporary directories of one bench run. Every child is
 * started through `bash -c 'ulimit -n <hard>; exec node …'` (Node 20 has no
 * setrlimit) so its pid is the node (or upstream's) process itself; each is
 * stopped by pid on the way out, including on failure, SIGINT and SIGTERM.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

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

export class Child {
  readonly exited: Promise<number | null>;
  private exitCode: number | null | undefined;

  constructor(
    readonly name: string,
    readonly proc: ChildProcess,
    readonly logFile: string,
  ) {
    this.exited = new Promise((resolve) => {
      proc.once('exit', (code, signal) => {
        this.exitCode = code ?? (signal ? -1 : null);
        live.delete(this);
        resolve(code);
      });
    });
  }

  get pid(): number {
    return this.proc.pid ?? 0;
  }

  get running(): boolean {
    return this.exitCode === undefined;
  }

  /** SIGTERM (or `signal`), then SIGKILL after `graceMs`; resolves when the process is gone. */
  async stop(signal: NodeJS.Signals = 'SIGTERM', graceMs = 5000): Promise<void> {
    if (!this.running) return;
    try {
      process.kill(this.pid, signal);
    } catch {
      return;
    }
    const timer = setTimeout(() => {
      try {
        process.kill(this.pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }, graceMs);
    await this.exited;
    clearTimeout(timer);
  }

  /** Last lines of the log, for error reports. */
  tail(lines = 15): string {
    try {
      return fs.readFileSync(this.logFile, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
    } catch {
      return '(no log)';
    }
  }
}

const live = new Set<Child>();
const tempDirs = new Set<string>();
let handlersInstalled = false;

function installHandlers(): void {
  if (handlersInstalled) return;
  handlersInstalled = true;
  // Last resort: whatever is still running when the driver exits is killed.
  process.on('exit', () => {
    for (const c of live) {
      try {
        process.kill(c.pid, 'SIGKILL');
      } catch {
        // gone
      }
    }
    for (const d of tempDirs) fs.rmSync(d, { recursive: true, force: true });
  });
  for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
    process.once(signal, () => {
      process.stderr.write(`\nbench: ${signal}, stopping ${live.size} child process(es) and removing temporary files\n`);
      cleanUp(1000).finally(() => process.exit(130));
    });
  }
}

export function spawnChild(opts: SpawnOptions): Child {
  installHandlers();
  const out = fs.openSync(opts.logFile, 'a');
  const wrapper = 'h=$(ulimit -Hn); ulimit -n "$h" 2>/dev/null || ulimit -n 65536 2>/dev/null; exec "$@"';
  const program = 'executable' in opts ? [opts.executable] : [process.execPath, ...(opts.nodeArgs ?? []), opts.script];
  const proc = spawn('bash', ['-c', wrapper, 'kanal-bench', ...program, ...(opts.args ?? [])], {
    stdio: opts.ipc ? ['ignore', out, out, 'ipc'] : ['ignore', out, out],
  });
  fs.closeSync(out);
  const child = new Child(opts.name, proc, opts.logFile);
  live.add(child);
  return child;
}

export function makeTempDir(prefix: string): string {
  installHandlers();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  tempDirs.add(dir);
  return dir;
}

/** Stops every live child (by pid) and removes every temporary directory. */
export async function cleanUp(graceMs = 5000): Promise<void> {
  await Promise.all([...live].map((c) => c.stop('SIGTERM', graceMs)));
  for (const d of tempDirs) fs.rmSync(d, { recursive: true, force: true });
  tempDirs.clear();
}

export function liveChildren(): number {
  return live.size;
}
