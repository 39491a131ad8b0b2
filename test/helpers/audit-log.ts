/** What the audit log tests share: a logger whose lines they read, a metric's value, records of an exact line length, a file's records. */
import fs from 'node:fs';
import { pino, type Logger } from 'pino';
import type { Registry } from 'prom-client';

export interface LogLine {
  level: number;
  msg: string;
  [field: string]: unknown;
}

/** A logger at info whose lines land, parsed, in `lines`. */
export function capturedLog(): { log: Logger; lines: LogLine[]; warnings: () => LogLine[] } {
  const lines: LogLine[] = [];
  const log = pino({ level: 'info' }, { write: (s: string) => void lines.push(JSON.parse(s) as LogLine) });
  return { log, lines, warnings: () => lines.filter((l) => l.level === 40) };
}

/** A sample's value in `registry` (labels matched as given), or undefined when it has none. */
export async function metricValue(registry: Registry, name: string, labels: Record<string, string> = {}): Promise<number | undefined> {
  const family = (await registry.getMetricsAsJSON()).find((m) => m.name === name);
  const sample = family?.values.find((v) => Object.entries(labels).every(([k, l]) => v.labels[k] === l));
  return sample?.value;
}

/** A record whose JSON line (newline included) is exactly `bytes` long. */
export function recordOfSize(i: number, bytes: number): { i: number; pad: string } {
  const bare = JSON.stringify({ i, pad: '' }).length + 1;
  if (bytes < bare) throw new Error(`a record ${i} needs at least ${bare} bytes`);
  return { i, pad: 'x'.repeat(bytes - bare) };
}

/** The records an audit log file holds now, one JSON object per line (none while the file is not there yet). */
export function auditRecords(file: string): Record<string, unknown>[] {
  if (!fs.existsSync(file)) return [];
  return fs
    .readFileSync(file, 'utf8')
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l) as Record<string, unknown>);
}
