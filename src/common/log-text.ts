/**
 * `--logging-format=text`: each of pino's JSON lines rewritten as one line for
 * a person at a terminal (docs/operations.md, "Logs"):
 *
 *   2026-11-27T05:33:46.123Z INFO  server  agent connected agentID=node-1 serverID=s1
 *
 * time, level, component, message, then the other fields as key=value in the
 * order pino wrote them. A value is quoted (JSON's quoting) when it is empty or
 * holds a space, `=`, `"`, a backslash or a character escaped below; an error
 * reads as its message; other objects as compact JSON.
 *
 * The input is already bounded (log-safety.ts) and no character a peer sent
 * reaches the terminal raw: C0 and C1 controls and DEL (escape sequences,
 * carriage returns, bells), the line and paragraph separators, the
 * bidirectional controls (CVE-2021-42574, "Trojan Source") and invisible
 * characters are written as \uXXXX, in the message as in the values, by the
 * escaping every terminal output shares (terminal-text.ts).
 *
 * A small formatter of Kanal's own rather than pino-pretty: that is not a
 * dependency, brings a dozen packages, and writes messages as they are.
 */
import { levels } from 'pino';
import { escapeForTerminal, hasUnsafeForTerminal, jsonForTerminal } from './terminal-text.js';

/** What a bare (unquoted) value may not hold, beyond what escapeForTerminal escapes. */
const NEEDS_QUOTES = /[\s"=\\]/;

/** JSON's quoting, with what escapeForTerminal escapes written as \uXXXX too. */
function quoted(s: string): string {
  return jsonForTerminal(s);
}

function bareOrQuoted(s: string): string {
  return s === '' || NEEDS_QUOTES.test(s) || hasUnsafeForTerminal(s) ? quoted(s) : s;
}

/** An error as log-safety.ts and pino's err serializer write it: its message, and its code when the message lacks it. */
function errorText(o: Record<string, unknown>): string | undefined {
  const { message, code } = o;
  if (typeof message !== 'string' || !('type' in o || 'stack' in o)) return undefined;
  return typeof code === 'string' && !message.includes(code) ? `${message} (${code})` : message;
}

function value(v: unknown): string {
  if (typeof v === 'string') return bareOrQuoted(v);
  if (v === null || typeof v !== 'object') return escapeForTerminal(String(v));
  if (!Array.isArray(v)) {
    const err = errorText(v as Record<string, unknown>);
    if (err !== undefined) return quoted(err);
  }
  return jsonForTerminal(v);
}

function levelName(v: unknown): string {
  const name = typeof v === 'number' ? levels.labels[v] : v;
  return typeof name === 'string' ? escapeForTerminal(name.toUpperCase()) : '-';
}

function timeText(v: unknown): string {
  if (typeof v === 'number') return new Date(v).toISOString();
  return typeof v === 'string' ? escapeForTerminal(v) : '-';
}

/** One pino JSON line (with its newline) as one text line; a line that is not a JSON object is kept, escaped. */
export function textLine(jsonLine: string): string {
  let record: unknown;
  try {
    record = JSON.parse(jsonLine);
  } catch {
    record = undefined;
  }
  if (record === null || typeof record !== 'object' || Array.isArray(record)) return `${escapeForTerminal(jsonLine.trimEnd())}\n`;
  const { time, level, component, msg, ...fields } = record as Record<string, unknown>;
  const head = [timeText(time), levelName(level).padEnd(5)];
  if (component !== undefined) head.push(`${value(component)} `);
  if (msg !== undefined) head.push(typeof msg === 'string' ? escapeForTerminal(msg) : value(msg));
  const rest = Object.entries(fields).map(([k, v]) => ` ${bareOrQuoted(k)}=${value(v)}`);
  return `${head.join(' ')}${rest.join('')}\n`;
}
