/**
 * On-demand CPU profiles and heap snapshots through Node's inspector, for the
 * admin port with --enable-profiling (docs/upstream-flags.md, "Admin port and profiles"). One at a time: each
 * costs CPU, and a heap snapshot stops the event loop while it is taken.
 */
import { Session } from 'node:inspector/promises';

/** A CPU profile longer than this is refused: the request would hold the profiler (and a socket) for long. */
export const MAX_CPU_PROFILE_SECONDS = 300;
export const DEFAULT_CPU_PROFILE_SECONDS = 30;

export class Profiler {
  /** What runs now ('cpu profile', 'heap snapshot'), or undefined. */
  private busy: string | undefined;

  /** The running job's name, for a refusal. */
  get running(): string | undefined {
    return this.busy;
  }

  /** A .cpuprofile (JSON, Chrome DevTools) covering the next `seconds`. */
  cpuProfile(seconds: number): Promise<string> {
    return this.exclusive('cpu profile', async (session) => {
      await session.post('Profiler.enable');
      await session.post('Profiler.start');
      await new Promise((resolve) => setTimeout(resolve, seconds * 1000));
      const { profile } = await session.post('Profiler.stop');
      return JSON.stringify(profile);
    });
  }

  /** A .heapsnapshot (JSON, Chrome DevTools), handed over in chunks as the inspector writes it. */
  heapSnapshot(write: (chunk: string) => void): Promise<void> {
    return this.exclusive('heap snapshot', async (session) => {
      session.on('HeapProfiler.addHeapSnapshotChunk', (m) => write(m.params.chunk));
      await session.post('HeapProfiler.takeHeapSnapshot', { reportProgress: false });
    });
  }

  private async exclusive<T>(what: string, run: (session: Session) => Promise<T>): Promise<T> {
    if (this.busy) throw new Error(`a ${this.busy} is being taken; try again when it is done`);
    this.busy = what;
    const session = new Session();
    session.connect();
    try {
      return await run(session);
    } finally {
      session.disconnect();
      this.busy = undefined;
    }
  }
}
