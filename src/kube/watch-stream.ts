/**
 * Reading a watch's response (`?watch=true`): one JSON event per line, each
 * bounded in length, an ERROR event or a cut stream ending the watch with a
 * KubeApiError (docs/limits.md).
 */
import type { IncomingMessage } from 'node:http';
import { errorFromStatus, KubeApiError, toKubeApiError } from './kube-api-error.js';

export interface WatchHandlers {
  onEvent(type: string, object: object): void;
  onEnd(err?: KubeApiError): void;
}

export interface WatchHandle {
  /** Closes the stream; `onEnd` runs (without an error) if it had not yet. */
  stop(): void;
}

/** One watch's response and where its events and its end go. */
export interface WatchResponse {
  /** The API server, named in errors. */
  server: string;
  /** `watch <path>`, named in errors. */
  operation: string;
  handlers: WatchHandlers;
  /** A longer line ends the watch: a broken or hostile API cannot make us buffer without bound. */
  maxLineBytes: number;
  /** Ends the watch (once), with the error if it failed. */
  end: (err?: KubeApiError) => void;
}

export function readWatch(res: IncomingMessage, watch: WatchResponse): void {
  const { server, operation, maxLineBytes, end } = watch;
  if (res.statusCode !== 200) {
    const chunks: Buffer[] = [];
    let size = 0;
    res.on('data', (c: Buffer) => {
      if (size < 64 * 1024) chunks.push(c);
      size += c.length;
    });
    res.on('end', () => end(errorFromStatus(server, operation, res.statusCode ?? 0, Buffer.concat(chunks).toString('utf8'))));
    res.on('error', (err) => end(toKubeApiError(server, operation, err)));
    return;
  }
  let pending = '';
  const tooLong = (text: string): boolean => {
    if (Buffer.byteLength(text) <= maxLineBytes) return false;
    end(new KubeApiError({ kind: 'invalid', operation, message: `watch event longer than ${maxLineBytes} bytes` }));
    return true;
  };
  res.setEncoding('utf8');
  res.on('data', (chunk: string) => {
    pending += chunk;
    let nl: number;
    while ((nl = pending.indexOf('\n')) >= 0) {
      const line = pending.slice(0, nl).trim();
      pending = pending.slice(nl + 1);
      if (tooLong(line) || (line && !dispatchEvent(watch, line))) return;
    }
    tooLong(pending);
  });
  res.on('end', () => end());
  res.on('error', (err) => end(toKubeApiError(server, operation, err)));
  res.on('close', () =>
    end(res.complete ? undefined : new KubeApiError({ kind: 'unreachable', operation, message: 'watch stream cut before its end' })),
  );
}

/** False when the watch ended (bad event or an ERROR event). */
function dispatchEvent({ server, operation, handlers, end }: WatchResponse, line: string): boolean {
  let event: { type?: unknown; object?: unknown };
  try {
    event = JSON.parse(line) as { type?: unknown; object?: unknown };
  } catch {
    end(new KubeApiError({ kind: 'invalid', operation, message: `watch event is not JSON: ${line.slice(0, 200)}` }));
    return false;
  }
  if (event.type === 'ERROR') {
    // The API reports a failed watch (410 Expired: resourceVersion too old) as an event.
    end(errorFromStatus(server, operation, statusCode(event.object) ?? 500, JSON.stringify(event.object)));
    return false;
  }
  if (typeof event.type !== 'string' || typeof event.object !== 'object' || event.object === null) {
    end(new KubeApiError({ kind: 'invalid', operation, message: `malformed watch event: ${line.slice(0, 200)}` }));
    return false;
  }
  handlers.onEvent(event.type, event.object);
  return true;
}

function statusCode(object: unknown): number | undefined {
  const code = typeof object === 'object' && object !== null ? (object as { code?: unknown }).code : undefined;
  return typeof code === 'number' ? code : undefined;
}
