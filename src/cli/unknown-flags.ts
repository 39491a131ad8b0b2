/**
 * What to say about flags a command does not know: the nearest known flags
 * by edit distance ("did you mean --proxy-server-host?"), and for a long flag
 * written with one dash, the two-dash form. Kanal refuses `-proxy-server-host`
 * rather than guessing: upstream's proxy-agent and proxy-server (cobra and
 * pflag) refuse it too ("unknown shorthand flag: 'p'"), so no upstream
 * command line carries it, and one dash stays the short flags' (-v, -o).
 */

/** Edit distance with adjacent transpositions (optimal string alignment): "hots" and "host" are one edit apart. */
export function editDistance(a: string, b: string): number {
  const d: number[][] = Array.from({ length: a.length + 1 }, (_, i) => [i, ...Array<number>(b.length).fill(0)]);
  for (let j = 1; j <= b.length; j++) d[0][j] = j;
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      d[i][j] = Math.min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) d[i][j] = Math.min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.length][b.length];
}

/**
 * The known flags nearest to `name` (ties: up to three), if within a third of
 * its length (at least 2 edits); a known flag that extends what was typed
 * counts as nearer than any edit.
 */
export function nearestFlags(name: string, known: readonly string[]): string[] {
  const limit = Math.max(2, Math.floor(name.length / 3));
  const scored = known
    .map((k) => ({ k, d: k.startsWith(name) && name.length >= 4 ? 0.5 : editDistance(name, k) }))
    .filter(({ d }) => d <= limit);
  const best = Math.min(...scored.map(({ d }) => d));
  return scored
    .filter(({ d }) => d === best)
    .map(({ k }) => k)
    .sort()
    .slice(0, 3);
}

function didYouMean(near: readonly string[]): string {
  return near.length === 0 ? 'no such flag' : `did you mean ${near.map((n) => `--${n}`).join(' or ')}?`;
}

/**
 * The message for a command line with unknown flags, from the words given
 * and the command's flags (`known`: names without dashes); undefined when no
 * word is an unknown flag (yargs' own message stands).
 */
export function unknownFlagsMessage(words: readonly string[], known: readonly string[]): string | undefined {
  const knownSet = new Set(known);
  const isKnown = (name: string): boolean => knownSet.has(name) || (name.startsWith('no-') && knownSet.has(name.slice(3)));
  const found: { shown: string; advice: string }[] = [];
  for (const word of words) {
    if (word === '--') break;
    const m = /^(-{1,2})([^=-][^=]*)(=.*)?$/.exec(word);
    if (!m) continue;
    const [, dashes, name] = m;
    if (dashes === '-' && name.length === 1) continue;
    if (dashes === '-') {
      const advice = isKnown(name)
        ? `long flags take two dashes (one reads as the short flags ${[...name.slice(0, 3)].join(', ')}, …): write --${name}`
        : `long flags take two dashes; ${didYouMean(nearestFlags(name, known))}`;
      found.push({ shown: `-${name}`, advice });
    } else if (!isKnown(name)) {
      found.push({ shown: name, advice: didYouMean(nearestFlags(name, known)) });
    }
  }
  if (found.length === 0) return undefined;
  const head = `Unknown argument${found.length > 1 ? 's' : ''}: ${found.map((f) => f.shown).join(', ')}`;
  return [head, ...found.map((f) => `  ${f.shown.startsWith('-') ? f.shown : `--${f.shown}`}: ${f.advice}`)].join('\n');
}
