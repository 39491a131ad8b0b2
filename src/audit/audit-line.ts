/** What the data path hands the audit log: a record, written as one JSON line. */

export interface AuditLog {
  /** Queues `record` as one JSON line; never blocks, never throws (a line that cannot be written is dropped and counted). */
  write(record: object): void;
  /** Stops taking records and writes what is queued, waiting at most timeoutMs (default 2 s); what is left is dropped and counted. */
  close(timeoutMs?: number): Promise<void>;
}

/** One audit record as one line: JSON escapes every newline inside its strings, so a line is a record. */
export function auditLine(record: object): string | undefined {
  try {
    const json: unknown = JSON.stringify(record);
    return typeof json === 'string' ? `${json}\n` : undefined;
  } catch {
    // A cycle or a BigInt: the record is dropped and counted, the caller goes on.
    return undefined;
  }
}
