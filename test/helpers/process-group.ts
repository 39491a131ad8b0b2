/**
 * A command in a process group of its own, as a terminal runs one: the test
 * can send the group a signal (Ctrl-C is SIGINT to the group), and the scope
 * kills the whole group, also after `limitMs` when the command hangs.
 */
import { spawn } from 'node:child_process';
import type { Scope } from '../../kit/launch/cleanup-scope.js';

export interface GroupRun {
  /** The command's pid, also its process group's ID. */
  pid: number;
  /** Its output so far, stdout and stderr. */
  output: () => string;
  /** Resolves with the output once it matches; rejects when the command ends first. */
  waitFor: (pattern: RegExp) => Promise<string>;
  ended: Promise<{ code: number | null; signal: NodeJS.Signals | null; output: string }>;
}

export function startInGroup(
  scope: Scope,
  command: string,
  args: readonly string[],
  o: { env?: NodeJS.ProcessEnv; limitMs: number; what: string },
): GroupRun {
  const child = spawn(command, args, { detached: true, env: { ...process.env, ...o.env }, stdio: ['ignore', 'pipe', 'pipe'] });
  const pid = child.pid!;
  const killGroup = (): void => {
    try {
      process.kill(-pid, 'SIGKILL');
    } catch {
      // gone
    }
  };
  const limit = setTimeout(killGroup, o.limitMs);
  scope.teardown(() => {
    clearTimeout(limit);
    killGroup();
  });
  let output = '';
  child.stdout.setEncoding('utf8').on('data', (d: string) => (output += d));
  child.stderr.setEncoding('utf8').on('data', (d: string) => (output += d));
  const ended = new Promise<{ code: number | null; signal: NodeJS.Signals | null; output: string }>((resolve) =>
    child.on('close', (code, signal) => {
      clearTimeout(limit);
      resolve({ code, signal, output });
    }),
  );
  const waitFor = (pattern: RegExp): Promise<string> =>
    new Promise((resolve, reject) => {
      const check = (): void => {
        if (pattern.test(output)) {
          child.stdout.off('data', check);
          resolve(output);
        }
      };
      child.stdout.on('data', check);
      check();
      void ended.then(() => reject(new Error(`${o.what} ended before ${String(pattern)}:\n${output}`)));
    });
  return { pid, output: () => output, waitFor, ended };
}

/** Whether a process with this pid exists (signal 0 probes without sending). */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}
