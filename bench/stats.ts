/** Small statistics helpers. */

export function median(values: readonly number[]): number {
  return percentile(values, 50);
}

/** Nearest-rank percentile (p in 0..100) of `values`; NaN when empty. */
export function percentile(values: readonly number[], p: number): number {
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.min(sorted.length - 1, Math.max(0, rank - 1))];
}

/** (max - min) / median: how far apart the repeated runs were; NaN (not shown) for a single run. */
export function spread(values: readonly number[]): number {
  if (values.length < 2) return Number.NaN;
  const m = median(values);
  return m === 0 ? 0 : (Math.max(...values) - Math.min(...values)) / m;
}

export function mean(values: readonly number[]): number {
  return values.length === 0 ? Number.NaN : values.reduce((a, b) => a + b, 0) / values.length;
}

/** Every other repetition runs the items in reverse, so no item always runs first after a pause. */
export function inRepOrder<T>(items: readonly T[], rep: number): readonly T[] {
  return rep % 2 === 0 ? items : [...items].reverse();
}

/** Median of the ratios of paired runs (a[i] / b[i]: each run divided by the one measured next to it). */
export function medianRatio(a: readonly number[], b: readonly number[]): number {
  return median(a.map((x, i) => x / b[i]));
}
