/** Reading a process's CPU time and memory from /proc, and describing the machine. */
import fs from 'node:fs';
import os from 'node:os';
import { execFileSync } from 'node:child_process';

let clockTicks = 0;

/** Clock ticks per second (`getconf CLK_TCK`), the unit of utime/stime in /proc/<pid>/stat. */
function ticksPerSecond(): number {
  if (clockTicks === 0) {
    try {
      clockTicks = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
    } catch {
      clockTicks = 100;
    }
  }
  return clockTicks;
}

/** Fields of /proc/<pid>/stat after the command name (rest[0] is field 3, state); [] once the process is gone. */
function statFields(pid: number): string[] {
  try {
    const text = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    // The command name (field 2) may contain spaces; fields after it are fixed.
    return text.slice(text.lastIndexOf(')') + 2).split(' ');
  } catch {
    return [];
  }
}

/** User + system CPU seconds consumed so far by `pid` (0 once the process is gone). */
export function cpuSeconds(pid: number): number {
  const rest = statFields(pid);
  // utime is field 14, stime field 15.
  return rest.length === 0 ? 0 : (Number(rest[11]) + Number(rest[12])) / ticksPerSecond();
}

export interface CpuTimes {
  userS: number;
  systemS: number;
  /** Summed over the process's threads. */
  voluntarySwitches: number;
  involuntarySwitches: number;
  minorFaults: number;
}

/** CPU time, context switches and minor page faults of `pid` so far (zeros once it is gone). */
export function cpuTimes(pid: number): CpuTimes {
  const rest = statFields(pid);
  const t: CpuTimes = { userS: 0, systemS: 0, voluntarySwitches: 0, involuntarySwitches: 0, minorFaults: 0 };
  if (rest.length === 0) return t;
  t.minorFaults = Number(rest[7]); // field 10
  t.userS = Number(rest[11]) / ticksPerSecond();
  t.systemS = Number(rest[12]) / ticksPerSecond();
  let tasks: string[] = [];
  try {
    tasks = fs.readdirSync(`/proc/${pid}/task`);
  } catch {
    // gone
  }
  for (const tid of tasks) {
    try {
      const status = fs.readFileSync(`/proc/${pid}/task/${tid}/status`, 'utf8');
      t.voluntarySwitches += Number(/^voluntary_ctxt_switches:\s+(\d+)/m.exec(status)?.[1] ?? 0);
      t.involuntarySwitches += Number(/^nonvoluntary_ctxt_switches:\s+(\d+)/m.exec(status)?.[1] ?? 0);
    } catch {
      // the thread exited meanwhile
    }
  }
  return t;
}

/** Sum of cpuSeconds over several processes. */
export function cpuSecondsOf(pids: readonly number[]): number {
  return pids.reduce((sum, pid) => sum + cpuSeconds(pid), 0);
}

/**
 * `pid`'s descendants (children first, then theirs), from /proc/<pid>/task/<tid>/children
 * (the kernel's list of each thread's children); [] once it is gone.
 */
export function descendantPids(pid: number): number[] {
  const out: number[] = [];
  const queue = [pid];
  while (queue.length > 0) {
    const parent = queue.shift()!;
    let tasks: string[];
    try {
      tasks = fs.readdirSync(`/proc/${parent}/task`);
    } catch {
      continue;
    }
    for (const tid of tasks) {
      let text: string;
      try {
        text = fs.readFileSync(`/proc/${parent}/task/${tid}/children`, 'utf8');
      } catch {
        continue;
      }
      for (const child of text.trim().split(/\s+/).filter(Boolean).map(Number)) {
        if (!out.includes(child)) {
          out.push(child);
          queue.push(child);
        }
      }
    }
  }
  return out;
}

/** Resident set size of `pid` in bytes (VmRSS), 0 once the process is gone. */
export function rssBytes(pid: number): number {
  try {
    const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
    const m = /^VmRSS:\s+(\d+)\s+kB/m.exec(status);
    return m ? Number(m[1]) * 1024 : 0;
  } catch {
    return 0;
  }
}

/**
 * Anonymous resident memory of `pid` in bytes (RssAnon): what the process
 * itself allocated. VmRSS adds the file pages it maps, which depend on the
 * page cache: a binary just written (built, copied) is cached in large folios
 * that map whole, so the same start reads 40 MiB higher (bench/README.md, section 6).
 */
export function rssAnonBytes(pid: number): number {
  try {
    const m = /^RssAnon:\s+(\d+)\s+kB/m.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) * 1024 : 0;
  } catch {
    return 0;
  }
}

/** Open file descriptors of `pid` (0 when unreadable). */
export function fdCount(pid: number): number {
  try {
    return fs.readdirSync(`/proc/${pid}/fd`).length;
  } catch {
    return 0;
  }
}

export interface MachineInfo {
  nproc: number;
  cpuModel: string;
  node: string;
  kernel: string;
  memTotalGiB: number;
}

export function machineInfo(): MachineInfo {
  let cpuModel = os.cpus()[0]?.model ?? 'unknown';
  try {
    const m = /^model name\s*:\s*(.+)$/m.exec(fs.readFileSync('/proc/cpuinfo', 'utf8'));
    if (m?.[1]) cpuModel = m[1].trim();
  } catch {
    // keep os.cpus()'s answer
  }
  return {
    nproc: os.availableParallelism(),
    cpuModel,
    node: process.version,
    kernel: os.release(),
    memTotalGiB: Math.round((os.totalmem() / 2 ** 30) * 10) / 10,
  };
}

/** CPU seconds the whole machine has spent busy (all cores), from /proc/stat. */
export function machineBusySeconds(): number {
  try {
    const line = fs.readFileSync('/proc/stat', 'utf8').split('\n')[0];
    const f = line.trim().split(/\s+/).slice(1).map(Number);
    // user nice system idle iowait irq softirq steal ...
    const busy = (f[0] ?? 0) + (f[1] ?? 0) + (f[2] ?? 0) + (f[5] ?? 0) + (f[6] ?? 0) + (f[7] ?? 0);
    return busy / ticksPerSecond();
  } catch {
    return 0;
  }
}

/** CPU seconds of this process plus its children that have exited (cutime, cstime). */
export function selfAndReapedChildrenCpuSeconds(): number {
  const rest = statFields(process.pid);
  return rest.length === 0 ? 0 : (Number(rest[11]) + Number(rest[12]) + Number(rest[13]) + Number(rest[14])) / ticksPerSecond();
}
