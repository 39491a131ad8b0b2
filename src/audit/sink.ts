/** Where a queued audit line goes: a regular file, a FIFO or a character device (stdout has its own path, stdout-audit-log.ts). */

/** Why a sink stopped taking lines: it failed (write_error) or a FIFO has no reader (no_reader). */
export type SinkDown = 'write_error' | 'no_reader';

/** A write that failed; the lines before `linesWritten` reached the destination. */
export class SinkError extends Error {
  override name = 'SinkError';
  constructor(
    readonly reason: SinkDown,
    readonly linesWritten: number,
    message: string,
  ) {
    super(message);
  }
}

export interface Sink {
  /** Opens the destination (again); rejects with a SinkError when it cannot. */
  open(): Promise<void>;
  /** Writes `lines` (each ending in a newline) in order, one call at a time; rejects with a SinkError (the sink is then closed until open()). */
  write(lines: readonly string[]): Promise<void>;
  /** Closes the destination; a write in flight rejects. */
  close(): Promise<void>;
}

/** `code: message` of an fs or socket error, for a log line. */
export function errnoText(err: unknown): string {
  if (err instanceof Error) {
    const code = (err as NodeJS.ErrnoException).code;
    return code && !err.message.startsWith(code) ? `${code}: ${err.message}` : err.message;
  }
  return String(err);
}
