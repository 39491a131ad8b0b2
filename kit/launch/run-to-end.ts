/** A command run to completion with its output collected and a hard time limit. */
import { spawn } from 'node:child_process';

export interface RunResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

export interface RunOptions {
  env?: NodeJS.ProcessEnv;
  /** SIGKILL after this long (default 100 s); stderr then says so. */
  timeoutMs?: number;
  cwd?: string;
  /** Command words to run the command under, e.g. ['setpriv', '--reuid=65534', ...]. */
  wrapper?: readonly string[];
}

/** Runs `cmd args` to completion; never rejects (a spawn error is in stderr). */
export function run(cmd: string, args: readonly string[], opts: RunOptions = {}): Promise<RunResult> {
  const argv = [...(opts.wrapper ?? []), cmd, ...args];
  const timeoutMs = opts.timeoutMs ?? 100_000;
  return new Promise((resolve) => {
    const child = spawn(argv[0], argv.slice(1), { env: opts.env ?? process.env, cwd: opts.cwd, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    const timer = setTimeout(() => {
      stderr += `\n[killed after ${timeoutMs} ms]`;
      child.kill('SIGKILL');
    }, timeoutMs);
    child.on('error', (err) => (stderr += `\n[spawn error: ${err.message}]`));
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout, stderr });
    });
  });
}
