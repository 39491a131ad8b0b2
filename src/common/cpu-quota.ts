/**
 * How many cores this process may use: the cgroup v2 CPU quota
 * (`cpu.max`, "QUOTA PERIOD" or "max PERIOD", Linux
 * Documentation/admin-guide/cgroup-v2.rst "CPU Interface Files") rounded up,
 * never more than the cores the scheduler lets it run on
 * (os.availableParallelism); without a quota, those cores. A container
 * limited to 2 CPUs on a 64-core host gets 2 workers, not 64.
 */
import fs from 'node:fs';
import os from 'node:os';

/** The quota of `text` (cpu.max's content) in cores, rounded up; undefined for "max" or anything unreadable. */
export function coresOfCpuMax(text: string): number | undefined {
  const [quota, period] = text.trim().split(/\s+/);
  const q = Number(quota);
  const p = Number(period ?? '100000');
  if (quota === 'max' || !Number.isFinite(q) || !Number.isFinite(p) || q <= 0 || p <= 0) return undefined;
  return Math.max(1, Math.ceil(q / p));
}

export function cpuQuota(cpuMaxPath = '/sys/fs/cgroup/cpu.max', cores = os.availableParallelism()): number {
  let text: string;
  try {
    text = fs.readFileSync(cpuMaxPath, 'utf8');
  } catch {
    return cores;
  }
  return Math.min(cores, coresOfCpuMax(text) ?? cores);
}
