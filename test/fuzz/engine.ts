/**
 * A small coverage-guided fuzzer for the parsers a peer feeds (docs/fuzzing.md).
 *
 * Why not a libFuzzer binding: Jazzer.js 4.0.0 (@jazzer.js/fuzzer) ships its
 * native addon only as prebuilt binaries that need glibc 2.38, which Debian 12
 * (this project's machines and CI, glibc 2.36) cannot load; its earlier
 * releases fetch the addon from GitHub in an install script, which CI cannot
 * reach. docs/fuzzing.md has the evidence.
 *
 * Coverage guidance comes from V8 itself: precise block coverage with call
 * counts (the inspector's Profiler.startPreciseCoverage, as c8 and
 * NODE_V8_COVERAGE use it), read back after each batch of inputs and turned
 * into libFuzzer-style features — a (block, hit-count bucket) pair. An input
 * that yields a feature never seen before joins the corpus and is mutated
 * further, so inputs that reach deeper into a parser are kept and bred from.
 *
 * The engine runs in a worker thread: the main thread watches a heartbeat in
 * shared memory, so an input that hangs the parser is stopped and reported
 * rather than hanging the test run.
 */
import { createHash } from 'node:crypto';
import { mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { Session } from 'node:inspector';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';

/** One fuzz target: a parser driven by bytes, with the properties it must keep. */
export interface FuzzTarget {
  name: string;
  /** What the target checks, for docs and failure messages. */
  description: string;
  /** Compiled source files (path suffixes, e.g. 'src/wire/codec.js') whose coverage guides this target. */
  covers: readonly string[];
  /** Longest input the mutator builds. */
  maxLen: number;
  /** Tokens the mutator inserts (protocol keywords, magic bytes). */
  dictionary?: readonly (string | Uint8Array)[];
  /** Bytes one input may make the parser allocate (array buffers); more is a finding. */
  maxAllocBytes?: number;
  /** Runs one input; throws (anything) when a property does not hold. */
  run(data: Uint8Array): void;
}

export interface FuzzOptions {
  /** Module (file URL or path) whose export `targets` lists FuzzTargets. */
  module: string;
  target: string;
  /** Corpus folders to start from (missing ones are skipped). */
  corpusDirs: readonly string[];
  timeMs: number;
  maxRuns?: number;
  seed?: number;
  /** An input running this long is reported as a hang. */
  hangMs?: number;
  /** Where to write inputs that found new coverage (the long run's --save). */
  saveDir?: string;
}

export type FailureKind = 'property' | 'hang' | 'allocation' | 'crash';

export interface FuzzFailure {
  kind: FailureKind;
  message: string;
  input: Uint8Array;
}

export interface FuzzResult {
  target: string;
  seed: number;
  runs: number;
  elapsedMs: number;
  corpusSize: number;
  features: number;
  seeds: number;
  failure?: FuzzFailure;
}

const DEFAULT_ALLOC_BYTES = 8 * 1024 * 1024;
/** How many inputs run between two coverage reads; a batch with new coverage is re-run input by input. */
const BATCH = 32;

// ---------- random numbers (seeded, so a run can be repeated) ----------

export class Rng {
  private s: number;
  constructor(seed: number) {
    this.s = seed >>> 0 || 0x9e3779b9;
  }
  /** mulberry32 */
  next(): number {
    let t = (this.s = (this.s + 0x6d2b79f5) >>> 0);
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (t ^ (t >>> 14)) >>> 0;
  }
  below(n: number): number {
    return n <= 1 ? 0 : this.next() % n;
  }
}

// ---------- mutation (after libFuzzer's MutationDispatcher) ----------

const INTERESTING_8 = [0x00, 0x01, 0x02, 0x07, 0x08, 0x0a, 0x0d, 0x10, 0x20, 0x3a, 0x7f, 0x80, 0x81, 0xfe, 0xff];
const INTERESTING_32 = [0, 1, 5, 0x7f, 0x80, 0xff, 0x100, 0x3fff, 0x4000, 0xffff, 0x10000, 0x7fffffff, 0x80000000, 0xfffffffe, 0xffffffff];

function varintBytes(v: bigint): number[] {
  const out: number[] = [];
  let u = BigInt.asUintN(64, v);
  while (u >= 0x80n) {
    out.push(Number(u & 0x7fn) | 0x80);
    u >>= 7n;
  }
  out.push(Number(u));
  return out;
}
const INTERESTING_VARINTS = [0n, 1n, 127n, 128n, 300n, (1n << 53n) - 1n, 1n << 53n, (1n << 63n) - 1n, -1n, 1n << 32n].map(varintBytes);

function concat(...parts: ArrayLike<number>[]): Uint8Array {
  let n = 0;
  for (const p of parts) n += p.length;
  const out = new Uint8Array(n);
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  return out;
}

export class Mutator {
  private readonly dict: Uint8Array[];
  constructor(
    private readonly rng: Rng,
    private readonly maxLen: number,
    dictionary: readonly (string | Uint8Array)[],
  ) {
    this.dict = dictionary.map((d) => (typeof d === 'string' ? new Uint8Array(Buffer.from(d, 'latin1')) : d));
  }

  /** One to five stacked mutations of `base`; `other` is a second corpus entry for crossover. */
  mutate(base: Uint8Array, other: Uint8Array): Uint8Array {
    let out = base;
    const n = 1 + this.rng.below(5);
    for (let i = 0; i < n; i++) out = this.once(out, other);
    return out.length > this.maxLen ? out.subarray(0, this.maxLen) : out;
  }

  private once(b: Uint8Array, other: Uint8Array): Uint8Array {
    const r = this.rng;
    const len = b.length;
    const pos = r.below(len + 1);
    switch (r.below(len === 0 ? 3 : 15)) {
      case 0: // insert random bytes
        return concat(
          b.subarray(0, pos),
          Array.from({ length: 1 + r.below(4) }, () => r.below(256)),
          b.subarray(pos),
        );
      case 1: // insert a dictionary token
        if (this.dict.length === 0) return concat(b.subarray(0, pos), [INTERESTING_8[r.below(INTERESTING_8.length)]], b.subarray(pos));
        return concat(b.subarray(0, pos), this.dict[r.below(this.dict.length)], b.subarray(pos));
      case 2: // insert an interesting varint
        return concat(b.subarray(0, pos), INTERESTING_VARINTS[r.below(INTERESTING_VARINTS.length)], b.subarray(pos));
      case 3: {
        // flip a bit
        const c = b.slice();
        c[r.below(len)] ^= 1 << r.below(8);
        return c;
      }
      case 4: {
        const c = b.slice();
        c[r.below(len)] = r.below(256);
        return c;
      }
      case 5: {
        const c = b.slice();
        c[r.below(len)] = INTERESTING_8[r.below(INTERESTING_8.length)]!;
        return c;
      }
      case 6: {
        // add or subtract a little
        const c = b.slice();
        const i = r.below(len);
        c[i] = (c[i] + r.below(33) - 16) & 0xff;
        return c;
      }
      case 7: {
        // erase a range
        const at = r.below(len);
        const n = 1 + r.below(Math.min(len - at, 16));
        return concat(b.subarray(0, at), b.subarray(at + n));
      }
      case 8: {
        // overwrite with a 32-bit value, big- or little-endian (gRPC lengths are big-endian)
        if (len < 4) return b;
        const c = b.slice();
        const v = INTERESTING_32[r.below(INTERESTING_32.length)];
        const at = r.below(len - 3);
        const dv = new DataView(c.buffer, c.byteOffset, c.byteLength);
        dv.setUint32(at, v, r.below(2) === 0);
        return c;
      }
      case 9: {
        // overwrite with a dictionary token
        if (this.dict.length === 0) return b;
        const t = this.dict[r.below(this.dict.length)];
        const c = b.slice();
        const at = r.below(len);
        c.set(t.subarray(0, len - at), at);
        return c;
      }
      case 10: {
        // copy a chunk of itself elsewhere (insert)
        const from = r.below(len);
        const n = 1 + r.below(Math.min(len - from, 64));
        return concat(b.subarray(0, pos), b.subarray(from, from + n), b.subarray(pos));
      }
      case 11: {
        // crossover: a prefix of this, a suffix of the other
        const cut = r.below(other.length + 1);
        return concat(b.subarray(0, pos), other.subarray(cut));
      }
      case 12: // truncate
        return b.subarray(0, r.below(len));
      case 13: {
        // swap two bytes
        const c = b.slice();
        const i = r.below(len);
        const j = r.below(len);
        const t = c[i];
        c[i] = c[j]!;
        c[j] = t;
        return c;
      }
      default: {
        // repeat a byte a few times (long runs: header sizes, varint continuations)
        const n = 1 + r.below(32);
        return concat(b.subarray(0, pos), new Uint8Array(n).fill(b[r.below(len)]), b.subarray(pos));
      }
    }
  }
}

// ---------- coverage ----------

interface CoverageRange {
  startOffset: number;
  endOffset: number;
  count: number;
}
interface FunctionCoverage {
  functionName: string;
  ranges: CoverageRange[];
}
interface ScriptCoverage {
  scriptId: string;
  url: string;
  functions: FunctionCoverage[];
}

/** libFuzzer's hit-count classes: 1, 2, 3, 4-7, 8-15, 16-31, 32-127, 128+. */
function bucket(count: number): number {
  if (count <= 3) return count;
  if (count < 8) return 4;
  if (count < 16) return 5;
  if (count < 32) return 6;
  if (count < 128) return 7;
  return 8;
}

/**
 * Reads V8's precise block coverage for the scripts a target covers. V8
 * leaves out a block whose count equals its enclosing block's, so a block
 * once seen is given the count of the innermost listed range around it:
 * that way a branch taken as often as its parent still counts as taken.
 */
export class Coverage {
  private readonly session = new Session();
  private readonly wanted = new Map<string, boolean>();
  /** Every block ever listed, per function ("scriptId:start"), as [start, end] pairs. */
  private readonly known = new Map<string, [number, number][]>();

  constructor(private readonly covers: readonly string[]) {
    this.session.connect();
    this.post('Profiler.enable');
    this.post('Profiler.startPreciseCoverage', { callCount: true, detailed: true });
  }

  private post(method: string, params?: object): unknown {
    // The in-thread session answers synchronously (node:inspector Session.post).
    const answer: { error: Error | null; result: unknown } = { error: null, result: undefined };
    this.session.post(method, params, (err: Error | null, res: unknown) => {
      answer.error = err;
      answer.result = res;
    });
    if (answer.error) throw answer.error;
    return answer.result;
  }

  /** Features since the last call (V8 resets the counters on each read). */
  take(into: (feature: string) => void): void {
    const { result } = this.post('Profiler.takePreciseCoverage') as { result: ScriptCoverage[] };
    for (const script of result) {
      let want = this.wanted.get(script.url);
      if (want === undefined) {
        const p = script.url.startsWith('file:') ? fileURLToPath(script.url).split(path.sep).join('/') : script.url;
        want = this.covers.some((c) => p.endsWith(c));
        this.wanted.set(script.url, want);
      }
      if (!want) continue;
      for (const fn of script.functions) {
        const ranges = fn.ranges;
        if (ranges.length === 0 || ranges[0].count === 0) continue;
        const key = `${script.scriptId}:${ranges[0].startOffset}`;
        let known = this.known.get(key);
        if (known === undefined) this.known.set(key, (known = []));
        for (const r of ranges) {
          if (!known.some(([s, e]) => s === r.startOffset && e === r.endOffset)) known.push([r.startOffset, r.endOffset]);
        }
        for (const [s, e] of known) {
          let count = 0;
          let width = Infinity;
          for (const r of ranges) {
            if (r.startOffset <= s && e <= r.endOffset && r.endOffset - r.startOffset < width) {
              width = r.endOffset - r.startOffset;
              count = r.count;
            }
          }
          if (count > 0) into(`${key}:${s}:${e}:${bucket(count)}`);
        }
      }
    }
  }

  close(): void {
    this.post('Profiler.stopPreciseCoverage');
    this.session.disconnect();
  }
}

// ---------- corpus ----------

export function loadCorpus(dirs: readonly string[]): Uint8Array[] {
  const out: Uint8Array[] = [];
  for (const dir of dirs) {
    let names: string[];
    try {
      names = readdirSync(dir).sort();
    } catch {
      continue;
    }
    for (const name of names) {
      const file = path.join(dir, name);
      if (statSync(file).isFile()) out.push(new Uint8Array(readFileSync(file)));
    }
  }
  return out;
}

export function inputName(input: Uint8Array): string {
  return createHash('sha1').update(input).digest('hex').slice(0, 16);
}

export function hex(input: Uint8Array, max = 4096): string {
  const h = Buffer.from(input.buffer, input.byteOffset, Math.min(input.length, max)).toString('hex');
  return input.length > max ? `${h}… (${input.length} bytes)` : h;
}

/** The one-paragraph report of a failure: target, kind, message, input in hex. */
export function describeFailure(target: string, f: FuzzFailure): string {
  return `fuzz target ${target}: ${f.kind}: ${f.message}\ninput (${f.input.length} bytes, hex): ${hex(f.input)}`;
}

// ---------- the loop (runs in the worker) ----------

/** Shared with the watching thread: [0] runs so far, [1] length of the current input; then its bytes. */
export const HEARTBEAT_HEADER = 8;

export function runEngine(target: FuzzTarget, opts: FuzzOptions, heartbeat: SharedArrayBuffer): FuzzResult {
  const seed = opts.seed ?? 1;
  const rng = new Rng(seed);
  const mutator = new Mutator(rng, target.maxLen, target.dictionary ?? []);
  const coverage = new Coverage(target.covers);
  const beat = new Int32Array(heartbeat, 0, 2);
  const current = new Uint8Array(heartbeat, HEARTBEAT_HEADER);
  const maxAlloc = target.maxAllocBytes ?? DEFAULT_ALLOC_BYTES;
  const seen = new Set<string>();
  const batchSeen = new Set<string>();
  const corpus: Uint8Array[] = [];
  const started = performance.now();
  let runs = 0;
  let seedCount = 0;

  const result = (failure?: FuzzFailure): FuzzResult => {
    coverage.close();
    return {
      target: target.name,
      seed,
      runs,
      elapsedMs: Math.round(performance.now() - started),
      corpusSize: corpus.length,
      features: seen.size,
      seeds: seedCount,
      ...(failure ? { failure } : {}),
    };
  };

  /** Runs one input; a thrown error is a property failure. */
  const exec = (input: Uint8Array): FuzzFailure | null => {
    const n = Math.min(input.length, current.length);
    current.set(input.subarray(0, n));
    Atomics.store(beat, 1, n);
    Atomics.add(beat, 0, 1);
    runs++;
    try {
      target.run(input);
      return null;
    } catch (err) {
      const message = err instanceof Error ? `${err.name}: ${err.message}\n${err.stack ?? ''}` : String(err);
      return { kind: 'property', message, input };
    }
  };

  const arrayBuffers = (): number => process.memoryUsage().arrayBuffers;

  /** Runs one input alone; returns a failure, or whether it found new coverage. */
  const single = (input: Uint8Array): FuzzFailure | boolean => {
    coverage.take(() => {});
    const before = arrayBuffers();
    const failure = exec(input);
    if (failure) return failure;
    const grew = arrayBuffers() - before;
    if (grew > maxAlloc) {
      return {
        kind: 'allocation',
        message: `an input of ${input.length} bytes made the parser allocate ${grew} bytes (limit ${maxAlloc})`,
        input,
      };
    }
    let fresh = false;
    coverage.take((f) => {
      if (!seen.has(f)) {
        seen.add(f);
        fresh = true;
      }
      batchSeen.add(f);
    });
    return fresh;
  };

  const keep = (input: Uint8Array): void => {
    corpus.push(input);
    if (opts.saveDir !== undefined) {
      mkdirSync(opts.saveDir, { recursive: true });
      writeFileSync(path.join(opts.saveDir, inputName(input)), input);
    }
  };

  // Every seed runs first (the regression part), and every seed stays in the corpus.
  const seeds = loadCorpus(opts.corpusDirs);
  seedCount = seeds.length;
  for (const s of seeds.length > 0 ? seeds : [new Uint8Array(0)]) {
    const r = single(s.length > target.maxLen ? s.subarray(0, target.maxLen) : s);
    if (typeof r !== 'boolean') return result(r);
    corpus.push(s);
  }

  const deadline = started + opts.timeMs;
  const maxRuns = opts.maxRuns ?? Infinity;
  const batch: Uint8Array[] = [];
  while (runs < maxRuns && performance.now() < deadline) {
    batch.length = 0;
    coverage.take(() => {});
    const before = arrayBuffers();
    for (let i = 0; i < BATCH; i++) {
      // Newer entries are likelier picks: they sit deeper in the parser.
      const pick = rng.below(2) === 0 ? corpus.length - 1 - rng.below(Math.min(corpus.length, 16)) : rng.below(corpus.length);
      const input = mutator.mutate(corpus[pick], corpus[rng.below(corpus.length)]);
      batch.push(input);
      const failure = exec(input);
      if (failure) return result(failure);
    }
    const grew = arrayBuffers() - before;
    let fresh = grew > maxAlloc;
    coverage.take((f) => {
      if (!batchSeen.has(f)) {
        batchSeen.add(f);
        fresh = true;
      }
    });
    if (!fresh) continue;
    for (const input of batch) {
      const r = single(input);
      if (typeof r !== 'boolean') return result(r);
      if (r) keep(input);
    }
  }
  return result();
}

// ---------- the watcher (main thread) ----------

const WORKER = new URL('./worker.js', import.meta.url);

/**
 * Runs one target in a worker thread until its time or run budget is spent,
 * or a property fails, or an input hangs (the worker is then stopped and the
 * input it was running is reported).
 */
export function runFuzz(opts: FuzzOptions, maxInputLen = 1 << 16): Promise<FuzzResult> {
  const heartbeat = new SharedArrayBuffer(HEARTBEAT_HEADER + maxInputLen);
  const beat = new Int32Array(heartbeat, 0, 2);
  const hangMs = opts.hangMs ?? 10_000;
  return new Promise<FuzzResult>((resolve, reject) => {
    // A heap limit, so a runaway allocation ends as a reported crash, not a machine out of memory.
    const worker = new Worker(WORKER, { workerData: { opts, heartbeat }, resourceLimits: { maxOldGenerationSizeMb: 512 } });
    let settled = false;
    let lastRuns = -1;
    let lastChange = Date.now();
    const watch = setInterval(
      () => {
        const r = Atomics.load(beat, 0);
        if (r !== lastRuns) {
          lastRuns = r;
          lastChange = Date.now();
          return;
        }
        if (Date.now() - lastChange < hangMs) return;
        const n = Atomics.load(beat, 1);
        const input = new Uint8Array(heartbeat, HEARTBEAT_HEADER, n).slice();
        settle({
          target: opts.target,
          seed: opts.seed ?? 1,
          runs: r,
          elapsedMs: 0,
          corpusSize: 0,
          features: 0,
          seeds: 0,
          failure: { kind: 'hang', message: `one input ran for more than ${hangMs} ms`, input },
        });
        void worker.terminate();
      },
      Math.min(250, hangMs / 4),
    );
    const settle = (res: FuzzResult | Error): void => {
      if (settled) return;
      settled = true;
      clearInterval(watch);
      if (res instanceof Error) reject(res);
      else resolve(res);
    };
    worker.on('message', (res: FuzzResult) => settle(res));
    worker.on('error', (err) => {
      // Out of memory or an error outside any input: report what was running.
      const n = Atomics.load(beat, 1);
      const input = new Uint8Array(heartbeat, HEARTBEAT_HEADER, n).slice();
      settle({
        target: opts.target,
        seed: opts.seed ?? 1,
        runs: Atomics.load(beat, 0),
        elapsedMs: 0,
        corpusSize: 0,
        features: 0,
        seeds: 0,
        failure: { kind: 'crash', message: `the fuzzing worker died: ${err.message}`, input },
      });
    });
    worker.on('exit', (code) => settle(new Error(`fuzzing worker for ${opts.target} exited with code ${code} before reporting`)));
  });
}
