/**
 * Where src/ spells each multi-word setting name, told apart by whether the
 * compiler checks it against the settings table: a typed spelling (the
 * table's own entry, a read of a parsed value `v['name']`, a handle
 * `flagOf(table, 'name')`, src/settings/flag-names.ts) fails to compile when
 * the setting is renamed; a free one (`'--name is required'`, a
 * `flag: 'name'` field) goes stale silently. Comments are not counted.
 */
import fs from 'node:fs';
import path from 'node:path';
import type { SettingTable } from '../../src/settings/setting.js';

export type SpellingKind = 'entry' | 'read' | 'handle' | 'type' | 'help' | 'free';

export interface Spelling {
  file: string;
  line: number;
  kind: SpellingKind;
}

/** The files that declare settings tables: their keys are entries, their help texts name related flags. */
const TABLE_FILE = /(^|\/|-)(settings|upstream-flags)\.ts$/;

/** Every .ts file under `dir`, relative to `root`, with its text (comments blanked, lines kept). */
export function sources(root: string, dir = 'src'): { file: string; text: string }[] {
  const out: { file: string; text: string }[] = [];
  const walk = (rel: string, depth: number): void => {
    if (depth > 10) return;
    for (const e of fs.readdirSync(path.join(root, rel), { withFileTypes: true })) {
      const child = path.join(rel, e.name);
      if (e.isDirectory()) walk(child, depth + 1);
      else if (e.name.endsWith('.ts')) out.push({ file: child, text: withoutComments(fs.readFileSync(path.join(root, child), 'utf8')) });
    }
  };
  walk(dir, 0);
  return out;
}

/** Block comments and line comments blanked (newlines kept); `//` inside a string (a URL) is left alone. */
function withoutComments(text: string): string {
  return text.replace(/\/\*[\s\S]*?\*\//g, (c) => c.replace(/[^\n]/g, ' ')).replace(/(^|[^:'"`\\])\/\/.*$/gm, '$1');
}

const escape = (s: string): string => s.replace(/[-]/g, '\\-');

/** What one spelling is, from the text before it on its line and the two characters after it. */
function classify(file: string, dashed: boolean, before: string, after: string): SpellingKind {
  const table = TABLE_FILE.test(file);
  // A table's help texts name the flags they relate to (rendered in --help and docs/flags.md), as do --help's example command lines.
  if (dashed) return table || /['"`]\$0 /.test(before) ? 'help' : 'free';
  if (table && /^\s*$/.test(before) && after.startsWith(':')) return 'entry';
  if (before.endsWith('[') && after.startsWith(']')) return 'read';
  if (/\b(flagOf|keyOf|flagsOf)\([\w.]+, (['"][\w-]+['"], )*$/.test(before)) return 'handle';
  if (/(\||Pick<\w+, |Omit<\w+, )\s*$/.test(before) || /^\s*\|/.test(after)) return 'type';
  return 'free';
}

/** Every spelling of `name` in `files`, each classified. */
export function spellingsOf(name: string, files: readonly { file: string; text: string }[]): Spelling[] {
  const n = escape(name);
  const any = new RegExp(`--${n}(?![\\w-])|(['"\`])${n}\\1`, 'g');
  const out: Spelling[] = [];
  for (const { file, text } of files) {
    for (const m of text.matchAll(any)) {
      const at = m.index;
      const lineStart = text.lastIndexOf('\n', at) + 1;
      const before = text.slice(lineStart, at);
      const after = text.slice(at + m[0].length, at + m[0].length + 2);
      const line = text.slice(0, at).split('\n').length;
      const kind = classify(file, m[0].startsWith('--'), before, after);
      out.push({ file, line, kind });
    }
  }
  return out;
}

/** The multi-word settings of `tables` shown in --help (upstream flags Kanal ignores aside), each with how many commands declare it. */
export function multiWordFlags(tables: readonly SettingTable[]): Map<string, number> {
  const names = new Map<string, number>();
  for (const table of tables)
    for (const [name, s] of Object.entries(table))
      if (name.includes('-') && !s.hidden && s.notice === undefined) names.set(name, (names.get(name) ?? 0) + 1);
  return names;
}

export interface SpellingCount {
  name: string;
  /** Every spelling, as the bar counts them: at most two per command (its entry and the one place that reads it). */
  total: number;
  free: number;
  commands: number;
}

/** Each multi-word flag's spellings in src/ under `root`. */
export function countSpellings(root: string, tables: readonly SettingTable[]): SpellingCount[] {
  const files = sources(root);
  return [...multiWordFlags(tables)].map(([name, commands]) => {
    const all = spellingsOf(name, files);
    return { name, commands, total: all.length, free: all.filter((s) => s.kind === 'free').length };
  });
}
