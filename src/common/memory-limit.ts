/**
 * The memory the process may use: the cgroup's limit when it has one (v2
 * memory.max, v1 memory.limit_in_bytes), else the machine's. What the
 * server's --memory-budget defaults from (docs/limits.md, "Retained bytes").
 */
import fs from 'node:fs';
import os from 'node:os';

/** cgroup v1 reports "no limit" as a number near 2^63 rounded to pages: anything this large is none. */
const NO_LIMIT_ABOVE = 2 ** 60;

/** The cgroup's memory limit in bytes, or undefined when there is none (or it cannot be read). */
export function cgroupMemoryLimit(
  files: readonly string[] = ['/sys/fs/cgroup/memory.max', '/sys/fs/cgroup/memory/memory.limit_in_bytes'],
): number | undefined {
  for (const file of files) {
    let text: string;
    try {
      text = fs.readFileSync(file, 'utf8').trim();
    } catch {
      continue;
    }
    if (text === 'max') return undefined;
    const n = Number(text);
    if (Number.isSafeInteger(n) && n > 0 && n < NO_LIMIT_ABOVE) return n;
    return undefined;
  }
  return undefined;
}

/**
 * The default memory budget of what connections hold: half the cgroup's
 * limit (the rest is the heap, the runtime and the kernel's socket
 * buffers), else a quarter of the machine's memory.
 */
export function defaultMemoryBudget(limit = cgroupMemoryLimit(), total = os.totalmem()): number {
  return limit !== undefined ? Math.floor(limit / 2) : Math.floor(total / 4);
}
