/**
 * prom-client metrics whose series are objects their users hold, for what is
 * counted once or more per dial and connection: prom-client's own inc() and
 * observe() build, validate and hash a label object on every call (and a
 * histogram looks its bucket up by a number turned into a string). A
 * counter's series adds to a number, handed to prom-client when scraped (its
 * `collect` hook); a histogram's series is a bucket search and three
 * additions, and scraped it gives what prom-client's Histogram gives for the
 * same observations: get()'s values in prom-client's order and shape
 * (node_modules/prom-client/lib/histogram.js, getForPromString), so the
 * registry writes the same text. Exemplars are not kept (Kanal enables none).
 */
import type { Histogram as PromHistogram } from 'prom-client';
import { Counter, Histogram, type CounterConfiguration, type HistogramConfiguration } from './prom-client.js';

type Labels<T extends string> = Parameters<Histogram<T>['zero']>[0];
type Exported<T extends string> = Awaited<ReturnType<Histogram<T>['get']>>;
/** A value as prom-client builds it: its series' labels apart until get(), an exemplar slot (none kept). */
type Value<T extends string> = Exported<T>['values'][number] & { sharedLabels?: Labels<T>; exemplar?: null };

/** prom-client's type name (its MetricType enum is declared, not exported at run time). */
const HISTOGRAM = 'histogram' as unknown as Exported<string>['type'];

/** prom-client's default buckets, as its Histogram takes them without `buckets`. */
const DEFAULT_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];

/** Orders series across all histograms; a counter, not a time. */
let shownSequence = 0;

/**
 * One series: its labels and what was observed, per bucket (not cumulative;
 * the last is above every bound). `shown`: in the metric's values, as
 * prom-client shows a series once observed or zeroed, one without labels always.
 */
export class HistogramSeries<T extends string = string> {
  readonly counts: Float64Array;
  sum = 0;
  count = 0;
  /** Set by show(); `shownAt` orders the shown series as prom-client's first observations do. */
  shown = false;
  shownAt = 0;

  constructor(
    readonly labels: Labels<T>,
    private readonly bounds: readonly number[],
  ) {
    this.counts = new Float64Array(bounds.length + 1);
  }

  /** A value that is not a finite number is not counted (prom-client throws; the data path must not). */
  observe(value: number): void {
    if (!Number.isFinite(value)) return;
    const { bounds } = this;
    let i = 0;
    while (i < bounds.length && value > bounds[i]) i++;
    this.counts[i]++;
    this.sum += value;
    this.count++;
    if (!this.shown) this.show();
  }

  show(): void {
    this.shown = true;
    this.shownAt = ++shownSequence;
  }

  /** Back to nothing observed; `shown` as a new series. */
  clear(shown: boolean): void {
    this.counts.fill(0);
    this.sum = 0;
    this.count = 0;
    this.shown = false;
    if (shown) this.show();
  }
}

export class SeriesHistogram<T extends string = string> extends Histogram<T> {
  /**
   * By the label values in `labelNames` order, joined; invariant: each key's
   * series has exactly those labels, and stays in the map once made (its
   * holders keep observing on it: reset() and remove() clear it instead).
   */
  private bySeries: Map<string, HistogramSeries<T>> | undefined;
  private readonly bounds: readonly number[];
  private readonly names: readonly T[];
  private readonly metricName: string;
  private readonly config: HistogramConfiguration<T>;

  constructor(config: HistogramConfiguration<T>) {
    super(config);
    // prom-client's constructor sets observe on the instance, over the class's own.
    Reflect.deleteProperty(this, 'observe');
    this.config = config;
    this.bounds = [...(config.buckets ?? DEFAULT_BUCKETS)].sort((a, b) => a - b);
    this.names = [...(config.labelNames ?? [])];
    this.metricName = config.name;
    if (this.names.length === 0) this.series();
  }

  /** The series of `labels` (created on first use): hold it, and observe on it. */
  series(labels: Labels<T> = {}): HistogramSeries<T> {
    this.bySeries ??= new Map();
    const key = this.keyOf(labels);
    let s = this.bySeries.get(key);
    if (!s) {
      for (const k of Object.keys(labels)) if (!this.names.some((n) => n === k)) throw new Error(`${this.metricName}: no label ${k}`);
      s = new HistogramSeries<T>({ ...labels }, this.bounds);
      if (this.names.length === 0) s.show();
      this.bySeries.set(key, s);
    }
    return s;
  }

  private keyOf(labels: Labels<T>): string {
    return this.names.map((n) => String(labels[n] ?? '')).join('\u0000');
  }

  /** prom-client's two ways to name a series: an object, or the values in `labelNames` order. */
  private labelsOf(args: [Labels<T>] | string[]): Labels<T> {
    const [first] = args;
    if (typeof first === 'object') return first;
    const out: Labels<T> = {};
    this.names.forEach((n, i) => {
      const v = args[i];
      if (typeof v === 'string') out[n] = v;
    });
    return out;
  }

  override observe(value: number): void;
  override observe(labels: Labels<T>, value: number): void;
  override observe(data: { value: number; labels?: Labels<T> }): void;
  override observe(a: number | Labels<T> | { value: number; labels?: Labels<T> }, b?: number): void {
    if (typeof a === 'number') this.series().observe(a);
    else if (b !== undefined) this.series(a as Labels<T>).observe(b);
    else if ('value' in a && typeof a.value === 'number') this.series((a as { labels?: Labels<T> }).labels ?? {}).observe(a.value);
  }

  override labels(...args: [Labels<T>] | string[]): PromHistogram.Internal<T> {
    const s = this.series(this.labelsOf(args));
    return {
      observe: (value) => s.observe(value),
      startTimer: () => {
        const start = performance.now();
        return () => s.observe((performance.now() - start) / 1000);
      },
    };
  }

  override startTimer(labels?: Labels<T>): (labels?: Labels<T>) => number {
    const start = performance.now();
    return (end) => {
      const seconds = (performance.now() - start) / 1000;
      this.series({ ...labels, ...end }).observe(seconds);
      return seconds;
    };
  }

  override zero(labels: Labels<T>): void {
    this.series(labels).clear(true);
  }

  override remove(...args: [Labels<T>] | string[]): void {
    this.bySeries?.get(this.keyOf(this.labelsOf(args)))?.clear(this.names.length === 0);
  }

  override reset(): void {
    // prom-client's constructor calls reset() before this class's fields exist.
    for (const s of this.bySeries?.values() ?? []) s.clear(this.names.length === 0);
  }

  /** What the registry writes: prom-client's values, its series labels as `sharedLabels` (after each `le`). */
  async getForPromString(): Promise<Exported<T>> {
    const { collect } = this.config;
    if (collect) await collect.call(this);
    const values: Value<T>[] = [];
    const bucket = `${this.metricName}_bucket`;
    const shown = [...(this.bySeries?.values() ?? [])].filter((s) => s.shown).sort((a, b) => a.shownAt - b.shownAt);
    for (const s of shown) {
      let acc = 0;
      for (let i = 0; i < this.bounds.length; i++) {
        acc += s.counts[i];
        values.push({
          labels: { le: this.bounds[i] } as Labels<T>,
          sharedLabels: s.labels,
          value: acc,
          metricName: bucket,
          exemplar: null,
        });
      }
      values.push(
        { labels: { le: '+Inf' } as Labels<T>, sharedLabels: s.labels, value: s.count, metricName: bucket, exemplar: null },
        { labels: {}, sharedLabels: s.labels, value: s.sum, metricName: `${this.metricName}_sum`, exemplar: undefined },
        { labels: {}, sharedLabels: s.labels, value: s.count, metricName: `${this.metricName}_count`, exemplar: undefined },
      );
    }
    // The fields prom-client's getForPromString() returns besides the values.
    return {
      name: this.metricName,
      help: this.config.help,
      type: HISTOGRAM,
      aggregator: this.config.aggregator ?? 'sum',
      values,
    } as Exported<T>;
  }

  /** As prom-client's get(): each value's series labels merged into its own. */
  override async get(): Promise<Exported<T>> {
    const data = await this.getForPromString();
    return {
      ...data,
      values: data.values.map((v: Value<T>) => {
        const { sharedLabels, ...rest } = v;
        return { ...rest, labels: { ...v.labels, ...sharedLabels } };
      }),
    };
  }
}

/** prom-client's label values (its LabelValues, which it does not export). */
type CounterLabels<T extends string> = Partial<Record<T, string | number>>;

/** One series of a SeriesCounter: what it counted since the last scrape; `touched`: inc() ran since (inc(0) makes a series, as prom-client's). */
export class CounterSeries<T extends string = string> {
  pending = 0;
  touched = false;
  constructor(readonly labels: CounterLabels<T>) {}

  /** As Counter.inc: `n` must not be negative (not checked: the callers count bytes and events). */
  inc(n = 1): void {
    this.pending += n;
    this.touched = true;
  }
}

/** A Counter whose series are held: inc() on one is an addition, folded into prom-client's value at scrape time. */
export class SeriesCounter<T extends string = string> extends Counter<T> {
  /** By label values in `labelNames` order; invariant: at a scrape, every pending count is added to prom-client's series. */
  private readonly bySeries: Map<string, CounterSeries<T>>;
  private readonly names: readonly T[];

  constructor(config: CounterConfiguration<T>) {
    const own = config.collect;
    const held = new Map<string, CounterSeries<T>>();
    super({
      ...config,
      async collect(this: Counter<T>) {
        for (const s of held.values()) {
          if (!s.touched) continue;
          this.inc(s.labels, s.pending);
          s.pending = 0;
          s.touched = false;
        }
        if (own) await own.call(this);
      },
    });
    this.bySeries = held;
    this.names = [...(config.labelNames ?? [])];
  }

  /** The series of `labels`, created on first use; it appears in the metric at its first inc(), as prom-client's. */
  series(labels: CounterLabels<T> = {}): CounterSeries<T> {
    const key = this.names.map((n) => String(labels[n] ?? '')).join('\u0000');
    let s = this.bySeries.get(key);
    if (!s) {
      for (const k of Object.keys(labels)) if (!this.names.some((n) => n === k)) throw new Error(`no label ${k}`);
      s = new CounterSeries<T>({ ...labels });
      this.bySeries.set(key, s);
    }
    return s;
  }

  override reset(): void {
    super.reset();
    // prom-client's constructor calls reset() before this class's fields exist.
    for (const s of this.bySeries?.values() ?? []) {
      s.pending = 0;
      s.touched = false;
    }
  }
}
