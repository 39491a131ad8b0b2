/**
 * The one escaping of text a peer chose (an agentID, a certificate subject, a
 * server's error text) before a terminal shows it: the text log
 * (log-text.ts), `kanal status` tables and JSON, `kanal agent --check`, and
 * the error a command ends with. Every character below is written as the
 * \uXXXX escape of its UTF-16 units, which JSON reads back as the same
 * character, so one function serves text and JSON alike:
 *
 * - C0 controls, DEL and C1 controls (U+0080–U+009F): ESC sequences, and the
 *   one-character CSI (U+009B) and OSC (U+009D) that recolour or retitle a
 *   terminal (ECMA-48, section 5.3);
 * - the line and paragraph separators (U+2028, U+2029);
 * - bidirectional marks, embeddings, overrides and isolates (U+061C,
 *   U+200E–U+200F, U+202A–U+202E, U+2066–U+2069: CVE-2021-42574, "Trojan
 *   Source"), which reorder what is shown;
 * - characters that show nothing and make two different names look alike:
 *   soft hyphen, zero-width spaces and joiners, word joiner and invisible
 *   operators, deprecated format controls, the byte order mark,
 *   interlinear annotations, and the tag characters (U+E0000–U+E007F) that
 *   can hide text in plain sight (Unicode TR36, "Unicode Security
 *   Considerations").
 *
 * Printable text of any script (and emoji) is kept as it is.
 */

/** One class for the characters above; tag characters are the surrogate pairs U+DB40 U+DC00–U+DC7F. */
const UNSAFE_CLASS =
  '[\u0000-\u001f\u007f-\u009f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb]|\udb40[\udc00-\udc7f]';

const UNSAFE = new RegExp(UNSAFE_CLASS, 'g');
const HAS_UNSAFE = new RegExp(UNSAFE_CLASS);

const SHORT_ESCAPES: Record<string, string> = { '\n': '\\n', '\r': '\\r', '\t': '\\t' };

/** `\uXXXX` of each UTF-16 unit of `c`. */
function unitEscapes(c: string): string {
  let out = '';
  for (let i = 0; i < c.length; i++) out += `\\u${c.charCodeAt(i).toString(16).padStart(4, '0')}`;
  return out;
}

/** Whether `s` holds a character escapeForTerminal rewrites. */
export function hasUnsafeForTerminal(s: string): boolean {
  return HAS_UNSAFE.test(s);
}

/**
 * `s` with every character above written as an escape (\n, \r and \t as
 * such). `keepNewlines`: a line break stays one, for a message of several
 * lines Kanal wrote itself.
 */
export function escapeForTerminal(s: string, options: { keepNewlines?: boolean } = {}): string {
  return s.replace(UNSAFE, (c) => (options.keepNewlines && c === '\n' ? c : (SHORT_ESCAPES[c] ?? unitEscapes(c))));
}

/**
 * A copy of `value` (a parsed JSON document) in which every string, keys
 * included, is escaped: for text built from a document a peer filled, so
 * that no field is forgotten.
 */
export function escapeStringsForTerminal<T>(value: T): T {
  const visit = (v: unknown): unknown => {
    if (typeof v === 'string') return escapeForTerminal(v);
    if (v === null || typeof v !== 'object') return v;
    if (Array.isArray(v)) return v.map(visit);
    const out: Record<string, unknown> = {};
    for (const [k, item] of Object.entries(v)) out[escapeForTerminal(k)] = visit(item);
    return out;
  };
  return visit(value) as T;
}

/**
 * JSON.stringify(value, null, indent) with the characters above written as
 * \uXXXX: JSON.stringify escapes C0 only and leaves DEL, C1, the separators
 * and bidi controls raw. The result parses back to the same value.
 */
export function jsonForTerminal(value: unknown, indent?: number): string {
  // Outside strings JSON.stringify writes only ASCII punctuation, digits,
  // letters, spaces and (with indent) newlines, so whatever matches is inside a string.
  return JSON.stringify(value, null, indent).replace(UNSAFE, (c) => (c === '\n' ? c : unitEscapes(c)));
}
