/**
 * Last resort for test workers that exit without running their teardowns
 * (an ava timeout, an uncaught exception): what is still registered here is
 * killed, deleted or removed when the process exits. Helpers add on start and
 * delete once they cleaned up normally.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';

export const killOnExit = new Set<number>();
export const deleteNetnsOnExit = new Set<string>();
export const removeOnExit = new Set<string>();

process.once('exit', () => {
  // Processes first: they may hold the namespaces and write into the directories.
  for (const pid of killOnExit) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
  for (const name of deleteNetnsOnExit) {
    try {
      execFileSync('ip', ['netns', 'del', name], { stdio: 'ignore', timeout: 5000 });
    } catch {
      // best effort
    }
  }
  for (const dir of removeOnExit) {
    try {
      fs.rmSync(dir, { recursive: true, force: true, maxRetries: 2 });
    } catch {
      // a dying child may still be writing its log; nothing more to do here
    }
  }
});
