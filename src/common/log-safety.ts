/**
 * Bounds what one log field can hold. Peers control many logged values
 * (addresses, agentIDs, authorities, metadata, their error texts); a 1 MiB
 * address must not become megabytes of log per line.
 * Applied to every field, message and child-logger binding by the logger
 * (see logger.ts), so no call site has to remember it.
 */
import type { LoggerOptions } from 'pino';

/** Longest string kept whole; longer ones keep this many characters and say how many were cut. */
export const MAX_LOG_STRING = 256;
/**
 * A line's message and its `err` are sentences Kanal writes to explain a
 * cause and the flag to change (src/agent/connect-diagnosis.ts): longer than
 * a field, and a peer's text inside them is still bounded, at this.
 */
export const MAX_LOG_MESSAGE = 1024;
const SENTENCE_FIELDS = new Set(['msg', 'err']);
/** Stack traces are ours, not a peer's (only the first line quotes a message): keep more of them. */
const MAX_LOG_STACK = 4096;
const MAX_ARRAY_ITEMS = 16;
const MAX_OBJECT_KEYS = 32;
const MAX_DEPTH = 4;
/** Characters all strings of one field may add up to. */
const FIELD_BUDGET = 8192;

/** `text` cut to `max` characters, with the number of characters left out. */
export function truncateForLog(text: string, max = MAX_LOG_STRING): string {
  if (text.length <= max) return text;
  return `${text.slice(0, max)}…[${text.length - max} more chars]`;
}

/** A copy of `value` in which every string, array, object and nesting level is bounded. */
export function boundForLog(value: unknown, field = ''): unknown {
  let budget = FIELD_BUDGET;
  const visit = (v: unknown, depth: number, key: string): unknown => {
    if (typeof v === 'string') {
      const max = key === 'stack' ? MAX_LOG_STACK : depth === 0 && SENTENCE_FIELDS.has(key) ? MAX_LOG_MESSAGE : MAX_LOG_STRING;
      const limit = Math.max(0, Math.min(max, budget));
      const out = truncateForLog(v, limit);
      budget -= Math.min(v.length, limit);
      return out;
    }
    if (v === null || typeof v !== 'object') return v;
    if (v instanceof Uint8Array) return `<${v.byteLength} bytes>`;
    if (v instanceof Date) return v.toISOString();
    if (depth >= MAX_DEPTH) return '[nested too deep]';
    if (Array.isArray(v)) {
      const items = v.slice(0, MAX_ARRAY_ITEMS).map((item) => visit(item, depth + 1, key));
      if (v.length > MAX_ARRAY_ITEMS) items.push(`…[${v.length - MAX_ARRAY_ITEMS} more items]`);
      return items;
    }
    if (v instanceof Error) {
      const code: unknown = Reflect.get(v, 'code');
      return visit({ type: v.name, message: v.message, ...(code === undefined ? {} : { code }), stack: v.stack }, depth, key);
    }
    const out: Record<string, unknown> = {};
    const keys = Object.keys(v);
    for (const k of keys.slice(0, MAX_OBJECT_KEYS)) out[truncateForLog(k, 64)] = visit(Reflect.get(v, k), depth + 1, k);
    if (keys.length > MAX_OBJECT_KEYS) out['…'] = `${keys.length - MAX_OBJECT_KEYS} more keys`;
    return out;
  };
  return visit(value, 0, field);
}

/** Each field of `fields` bounded on its own, as the logger bounds them. */
export function boundFields(fields: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(fields)) out[k] = boundForLog(v, k);
  return out;
}

/**
 * pino options that pass every top-level field of every line through
 * boundForLog: the fields of each call, its message, and the bindings of
 * every child logger (pino's `formatters.bindings` only sees the root's).
 * A censor on the path `*` is pino's one hook that sees all three.
 */
export const BOUNDED_LOG_FIELDS: Pick<LoggerOptions, 'redact'> = {
  // Named paths come first so the censor learns their key; '*' hands it every other key as null.
  redact: {
    paths: [...SENTENCE_FIELDS, '*'],
    censor: (value: unknown, path: readonly (string | null)[]) => boundForLog(value, path[0] ?? ''),
  },
};
