// Throwaway network namespaces for kernel-touching tests. Everything that
// creates links or addresses must run inside one of these, never in the
// machine's root namespace. Each is registered for deletion at exit
// (exit-cleanup.ts) until destroyed.

import { randomBytes } from 'node:crypto';
import { deleteNetnsOnExit } from './exit-cleanup.js';
import { run as runToEnd } from './run-to-end.js';

export interface ExecResult {
  code: number;
  stdout: string;
  stderr: string;
}

export interface Netns {
  name: string;
  /** Run a command inside the namespace (`ip netns exec <name> ...args`). */
  exec(args: string[], timeoutMs?: number): Promise<ExecResult>;
  /** Run `ip -n <name> ...args` (iproute2 acting on the namespace). */
  ip(args: string[], timeoutMs?: number): Promise<ExecResult>;
  /** Delete the namespace; safe to call more than once. */
  destroy(): Promise<void>;
}

const DEFAULT_TIMEOUT_MS = 20_000;

// Every namespace this process created and has not yet destroyed, so a
// test.after.always hook can sweep up after tests that never reached teardown.
const live = new Set<Netns>();

/** Run a command with a hard timeout; never rejects (code -1 when it did not exit by itself). */
export async function run(cmd: string, args: string[], timeoutMs = DEFAULT_TIMEOUT_MS): Promise<ExecResult> {
  const r = await runToEnd(cmd, args, { timeoutMs });
  return { code: r.code ?? -1, stdout: r.stdout, stderr: r.stderr };
}

/** Why kernel tests cannot run here, or undefined when they can. */
export async function netnsUnavailableReason(): Promise<string | undefined> {
  if (process.platform !== 'linux') return `not Linux (${process.platform})`;
  if (typeof process.getuid === 'function' && process.getuid() !== 0) return 'not running as root (netns tests need root)';
  const v = await run('ip', ['-V'], 5000);
  if (v.code !== 0) return `iproute2 'ip' not usable: ${v.stderr.trim() || `exit ${v.code}`}`;
  return undefined;
}

export async function createNetns(prefix: string): Promise<Netns> {
  const name = `${prefix}-${randomBytes(4).toString('hex')}`;
  const add = await run('ip', ['netns', 'add', name]);
  if (add.code !== 0) throw new Error(`ip netns add ${name} failed: ${add.stderr.trim()}`);
  let destroyed = false;
  const ns: Netns = {
    name,
    exec: (args, timeoutMs) => run('ip', ['netns', 'exec', name, ...args], timeoutMs),
    ip: (args, timeoutMs) => run('ip', ['-n', name, ...args], timeoutMs),
    async destroy() {
      if (destroyed) return;
      destroyed = true;
      live.delete(ns);
      const del = await run('ip', ['netns', 'del', name]);
      if (del.code !== 0 && !/No such file|not found/i.test(del.stderr)) {
        throw new Error(`ip netns del ${name} failed: ${del.stderr.trim()}`);
      }
      deleteNetnsOnExit.delete(name);
    },
  };
  live.add(ns);
  deleteNetnsOnExit.add(name);
  return ns;
}

/** Destroy every namespace still alive; use in test.after.always. */
export async function destroyAllNetns(): Promise<void> {
  await Promise.allSettled([...live].map((ns) => ns.destroy()));
}
