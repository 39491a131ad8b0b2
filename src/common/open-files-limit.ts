/**
 * The process's open-files limit (RLIMIT_NOFILE), which Node can read only
 * from /proc/self/limits (it has no getrlimit). Node raises the soft limit to
 * the hard one at start, so the soft value is what the process has.
 */
import fs from 'node:fs';

/** The soft limit, or undefined when unknown (not Linux, or "unlimited"). */
export function openFilesLimit(limitsFile = '/proc/self/limits'): number | undefined {
  let text: string;
  try {
    text = fs.readFileSync(limitsFile, 'utf8');
  } catch {
    return undefined;
  }
  const m = /^Max open files\s+(\d+)\s/m.exec(text);
  return m ? Number(m[1]) : undefined;
}

/**
 * Default cap on the server's node -> control plane connections: half the
 * open-files limit, so frontends, agent tunnels and the health endpoint keep
 * the other half whatever agents do (docs/limits.md).
 */
export function defaultNodeToCpConnections(limit = openFilesLimit()): number {
  return Math.max(1, Math.floor((limit ?? 1024) / 2));
}
