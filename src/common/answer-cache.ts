/**
 * The last few answers of an expensive GET, each kept for `maxAgeMs` and
 * shared by every caller asking the same query meanwhile: thirty callers of
 * /status cost one rendering, and each holds a reference to one Buffer
 * rather than a copy of its own (docs/limits.md, "Health and admin ports").
 */
export interface CachedAnswer {
  status: number;
  contentType: string;
  body: Buffer;
}

export class AnswerCache {
  /** Insertion order is age order: the first entry is the oldest. */
  private readonly entries = new Map<string, { at: number; answer: CachedAnswer }>();

  constructor(
    private readonly maxEntries = 4,
    private readonly maxAgeMs = 1000,
    private readonly clock: () => number = Date.now,
  ) {}

  /** The answer to `key`, made by `make` unless one younger than maxAgeMs is kept. */
  get(key: string, make: () => CachedAnswer): CachedAnswer {
    const now = this.clock();
    for (const [k, e] of this.entries) {
      if (now - e.at < this.maxAgeMs) break;
      this.entries.delete(k);
    }
    const kept = this.entries.get(key);
    if (kept) return kept.answer;
    const answer = make();
    if (this.entries.size >= this.maxEntries) this.entries.delete(this.entries.keys().next().value as string);
    this.entries.set(key, { at: now, answer });
    return answer;
  }
}
