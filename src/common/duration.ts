/** Go-style durations ("500ms", "5s", "1m30s"), as upstream's flags take them. */
const UNIT_MS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 };

export function parseDuration(text: string): number {
  const trimmed = text.trim();
  if (/^\d+$/.test(trimmed)) throw new Error(`duration ${JSON.stringify(text)} needs a unit (ms, s, m, h), e.g. "${trimmed}s"`);
  const part = /(\d+(?:\.\d+)?)(ms|s|m|h)/gy;
  let total = 0;
  let consumed = 0;
  for (let m = part.exec(trimmed); m; m = part.exec(trimmed)) {
    total += Number(m[1]) * UNIT_MS[m[2]];
    consumed = part.lastIndex;
  }
  if (consumed === 0 || consumed !== trimmed.length)
    throw new Error(`invalid duration ${JSON.stringify(text)} (examples: 500ms, 5s, 1m30s)`);
  return Math.round(total);
}
