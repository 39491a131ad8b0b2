/**
 * A child process of the kit (a `kanal` command, upstream's binaries, a
 * stand-in service): stdout and stderr appended to its log file, optionally
 * run inside a network namespace, under a wrapper (prlimit, a shell setting
 * the umask) or with an IPC channel; registered on a cleanup scope and on the
 * exit last resort, stopped by pid with a bounded grace.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import { killOnExit } from './exit-cleanup.js';
import type { Scope } from './cleanup-scope.js';
import { jsonObjects, logTail, pinoLines, readLog, readLogText, waitUntilLogged, type LogLine } from './log-reader.js';

export interface ChildSpec {
  /** Short name for messages (and the default log file stem of callers). */
  name: string;
  /** Program and its arguments. */
  argv: readonly string[];
  /** stdout and stderr are appended here. */
  logFile: string;
  /** Runs argv inside this network namespace (`ip netns exec`). */
  netns?: string;
  /** Prepended to argv (inside the namespace), e.g. ['prlimit', '--nofile=64:64', '--']. */
  wrapper?: readonly string[];
  /** Set by a shell that then execs argv, so the pid stays the program's own. */
  umask?: number;
  env?: NodeJS.ProcessEnv;
  /** Opens an IPC channel (process.send in the child). */
  ipc?: boolean;
}

export interface ChildExit {
  code: number | null;
  signal: NodeJS.Signals | null;
}

/** How long stop() waits after its signal before SIGKILL. */
export const STOP_GRACE_MS = 10_000;

export class Child {
  readonly name: string;
  readonly logFile: string;
  readonly proc: ChildProcess;
  readonly pid: number;
  /** Where this process's output starts in the log file (a retried start appends to the same file). */
  readonly logStart: number;
  /** Settles once, with how the process ended. */
  readonly exited: Promise<ChildExit>;
  /** Set when the process ended; undefined while it runs. */
  private exit: ChildExit | undefined;

  constructor(spec: ChildSpec) {
    const command = [...(spec.wrapper ?? []), ...spec.argv];
    const shell =
      spec.umask === undefined
        ? command
        : ['/bin/sh', '-c', `umask ${spec.umask.toString(8).padStart(4, '0')} && exec "$0" "$@"`, ...command];
    const full = spec.netns === undefined ? shell : ['ip', 'netns', 'exec', spec.netns, ...shell];
    const out = fs.openSync(spec.logFile, 'a');
    this.logStart = fs.fstatSync(out).size;
    try {
      this.proc = spawn(full[0], full.slice(1), {
        stdio: spec.ipc ? ['ignore', out, out, 'ipc'] : ['ignore', out, out],
        env: spec.env ?? process.env,
      });
    } finally {
      fs.closeSync(out);
    }
    this.name = spec.name;
    this.logFile = spec.logFile;
    const pid = this.proc.pid;
    // spawn() reports a missing program asynchronously; keep that error from being uncaught.
    this.proc.on('error', () => undefined);
    this.exited = new Promise<ChildExit>((resolve) => {
      const done = (exit: ChildExit): void => {
        if (this.exit) return;
        this.exit = exit;
        if (pid !== undefined) killOnExit.delete(pid);
        resolve(exit);
      };
      this.proc.once('exit', (code, signal) => done({ code, signal }));
      if (pid === undefined) this.proc.once('error', () => done({ code: null, signal: null }));
    });
    if (pid === undefined) throw new Error(`could not start ${spec.name} (${full[0]})`);
    this.pid = pid;
    killOnExit.add(pid);
  }

  running(): boolean {
    return this.exit === undefined;
  }

  /** "exited with 1" / "was killed by SIGKILL" once ended, else undefined. */
  ended(): string | undefined {
    if (!this.exit) return undefined;
    return this.exit.signal ? `was killed by ${this.exit.signal}` : `exited with ${this.exit.code}`;
  }

  /** Everything the process wrote so far. */
  log(): string {
    return readLogText(this.logFile);
  }

  /** What this process wrote, without an earlier process's output in the same file. */
  ownLog(): string {
    try {
      return fs.readFileSync(this.logFile).subarray(this.logStart).toString('utf8');
    } catch {
      return '';
    }
  }

  /** Its output lines that are JSON objects (pino lines, events of the stand-in services). */
  jsonLines(): Record<string, unknown>[] {
    return jsonObjects(this.log());
  }

  /** Its pino lines. */
  logLines(): LogLine[] {
    return readLog(this.logFile);
  }

  tail(lines = 15): string {
    return logTail(this.logFile, lines);
  }

  /**
   * Waits until the log shows a pino line that `match` accepts, or (for a
   * text log such as klog) text that the pattern matches, resolving with that
   * line or the matched text. Fails at timeoutMs, or as soon as the process
   * ends without it.
   */
  waitForLog(match: (l: LogLine) => boolean, timeoutMs: number, what: string): Promise<LogLine>;
  waitForLog(match: RegExp, timeoutMs: number, what: string): Promise<string>;
  waitForLog(match: RegExp | ((l: LogLine) => boolean), timeoutMs: number, what: string): Promise<LogLine | string> {
    const find =
      match instanceof RegExp ? (text: string) => match.exec(text)?.[0] : (text: string) => pinoLines(jsonObjects(text)).find(match);
    return waitUntilLogged<LogLine | string>({
      file: this.logFile,
      find,
      timeoutMs,
      what: `${this.name}: ${what}`,
      ended: () => this.ended(),
    });
  }

  /** Same for any JSON line (events of the stand-in services). */
  waitForLine(
    match: (l: Record<string, unknown>) => boolean,
    timeoutMs: number,
    what = 'the expected line',
  ): Promise<Record<string, unknown>> {
    return waitUntilLogged({
      file: this.logFile,
      find: (text) => jsonObjects(text).find(match),
      timeoutMs,
      what: `${this.name}: ${what}`,
      ended: () => this.ended(),
    });
  }

  /** Sends a signal unless the process already ended. */
  signal(s: NodeJS.Signals): void {
    if (!this.running()) return;
    try {
      process.kill(this.pid, s);
    } catch {
      // exited meanwhile
    }
  }

  /**
   * SIGCONT (in case it was paused), then `signal`; SIGKILL after graceMs.
   * Resolves on exit with the exit code (null when a signal ended it; `exited` tells which).
   */
  async stop(signal: NodeJS.Signals = 'SIGTERM', graceMs = STOP_GRACE_MS): Promise<number | null> {
    if (this.exit) return this.exit.code;
    this.signal('SIGCONT');
    this.signal(signal);
    const timer = setTimeout(() => this.signal('SIGKILL'), graceMs);
    const exit = await this.exited;
    clearTimeout(timer);
    return exit.code;
  }

  /** SIGSTOP: the process stops answering anything. */
  pause(): void {
    this.signal('SIGSTOP');
  }

  resume(): void {
    this.signal('SIGCONT');
  }

  /** SIGKILL, and wait for the exit. */
  async kill(): Promise<void> {
    this.signal('SIGKILL');
    await this.exited;
  }
}

/** Starts a child that `scope` stops (SIGTERM, then SIGKILL) at teardown. */
export function spawnChild(scope: Scope, spec: ChildSpec): Child {
  const child = new Child(spec);
  scope.teardown(async () => {
    await child.stop();
  });
  return child;
}
