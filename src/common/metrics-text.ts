/**
 * Several registries' Prometheus text as one exposition: each metric family
 * once (its HELP and TYPE lines, then every registry's samples of it), in
 * the order families first appear. A server of many tenants keeps one
 * registry per tenant (docs/multi-tenant.md); merging their text costs one
 * pass over it, where prom-client's AggregatorRegistry rebuilds every metric
 * and renders it again (a quarter second per scrape at 1,000 tenants, all of
 * it on the event loop every tenant's dials wait for). Samples of one family
 * from different registries must differ in their labels (here: `tenant`,
 * `worker`), as the text format requires.
 */

/** The family a line belongs to: `# HELP name ...`, `# TYPE name ...`, or a sample `name{...} value` / `name value`. */
function familyOf(line: string): { family: string; meta: boolean } {
  if (line.startsWith('# ')) {
    const rest = line.slice(line.indexOf(' ', 2) + 1);
    return { family: rest.slice(0, rest.indexOf(' ') < 0 ? rest.length : rest.indexOf(' ')), meta: true };
  }
  const end = line.search(/[{ ]/);
  return { family: end < 0 ? line : line.slice(0, end), meta: false };
}

/** The base name of a histogram's or summary's sample (`x_bucket`, `x_sum`, `x_count` belong to `x`). */
function baseOf(name: string, known: ReadonlyMap<string, unknown>): string {
  for (const suffix of ['_bucket', '_sum', '_count']) {
    if (name.endsWith(suffix)) {
      const base = name.slice(0, -suffix.length);
      if (known.has(base)) return base;
    }
  }
  return name;
}

export function mergeExpositions(texts: readonly string[]): string {
  const families = new Map<string, { meta: string[]; samples: string[] }>();
  for (const text of texts) {
    for (const line of text.split('\n')) {
      if (line === '') continue;
      const { family, meta } = familyOf(line);
      const name = meta ? family : baseOf(family, families);
      let f = families.get(name);
      if (!f) {
        f = { meta: [], samples: [] };
        families.set(name, f);
      }
      if (meta) {
        // HELP and TYPE once per family: the first registry's.
        if (f.meta.length < 2 && !f.meta.some((m) => m.slice(0, 6) === line.slice(0, 6))) f.meta.push(line);
      } else f.samples.push(line);
    }
  }
  const blocks: string[] = [];
  for (const f of families.values()) {
    if (f.samples.length > 0) blocks.push(`${f.meta.join('\n')}\n${f.samples.join('\n')}\n`);
  }
  // A blank line between families, as prom-client writes them.
  return blocks.join('\n');
}

/** Registries rendered between which the event loop is let go, so a scrape of many tenants never stalls their dials for long. */
const REGISTRIES_PER_TURN = 50;

/** Each registry's text, rendered a few at a time with the event loop let go in between. */
export async function renderEach(registries: readonly { metrics(): Promise<string> }[]): Promise<string[]> {
  const texts: string[] = [];
  for (let i = 0; i < registries.length; i += REGISTRIES_PER_TURN) {
    if (i > 0) await new Promise<void>((resolve) => setImmediate(resolve));
    texts.push(...(await Promise.all(registries.slice(i, i + REGISTRIES_PER_TURN).map((r) => r.metrics()))));
  }
  return texts;
}
