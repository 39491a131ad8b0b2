/**
 * One cleanup scope for everything a test, the demo or the bench starts:
 * each resource registers its undo step on a {@link Scope} (ava's `t` is one;
 * a {@link CleanupStack} serves a whole file or program) and the steps run in
 * reverse order. exit-cleanup.ts is the last resort when a process exits
 * without running them.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { removeOnExit } from './exit-cleanup.js';

/** Anything that runs cleanup functions later, in reverse order (ava's `t` is one). */
export interface Scope {
  teardown(fn: () => void | Promise<void>): void;
}

/** A Scope for fixtures shared by several tests or a whole program: call run() at the end. */
export class CleanupStack implements Scope {
  /** Undo steps in registration order; run() pops them, so the newest runs first. */
  private readonly fns: (() => void | Promise<void>)[] = [];

  teardown(fn: () => void | Promise<void>): void {
    this.fns.push(fn);
  }

  async run(): Promise<void> {
    while (this.fns.length > 0) {
      const fn = this.fns.pop()!;
      try {
        await fn();
      } catch {
        // Keep cleaning up; a failed cleanup step must not leak the rest.
      }
    }
  }
}

/** A new directory under the system temp dir, removed by the scope (or at exit, whichever comes first). */
export function scopedTempDir(scope: Scope, prefix: string): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  removeOnExit.add(dir);
  scope.teardown(() => {
    fs.rmSync(dir, { recursive: true, force: true });
    removeOnExit.delete(dir);
  });
  return dir;
}
