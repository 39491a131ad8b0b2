/**
 * The one error of every Kubernetes API call (KubeApiError): its kind, what
 * was attempted, and a message that says what to fix; and how a failure or
 * an HTTP status becomes one.
 */
import { ApiException } from '@kubernetes/client-node';
import { errorMessage } from '../common/error-message.js';

export type KubeApiErrorKind =
  /** No answer within the deadline. */
  | 'timeout'
  /** Connection refused, reset, DNS, TLS verification, ... */
  | 'unreachable'
  /** Refused before sending: too many calls waiting, or the rate limit would pass the deadline. */
  | 'overloaded'
  | 'unauthorized'
  | 'forbidden'
  | 'not-found'
  | 'conflict'
  | 'gone'
  | 'invalid'
  /** 429 from the API (priority and fairness). */
  | 'throttled'
  | 'server-error'
  /** Anything else, e.g. a credential file the client could not read. */
  | 'client';

export interface KubeApiErrorFields {
  kind: KubeApiErrorKind;
  /** What was attempted, e.g. `update lease kube-system/x`. */
  operation: string;
  message: string;
  /** HTTP status when the API answered. */
  status?: number;
  /** The Status `reason` the API gave (Conflict, AlreadyExists, Expired, ...). */
  reason?: string;
}

export class KubeApiError extends Error {
  override readonly name = 'KubeApiError';
  readonly kind: KubeApiErrorKind;
  readonly operation: string;
  readonly status: number | undefined;
  readonly reason: string | undefined;

  constructor({ kind, operation, message, status, reason }: KubeApiErrorFields) {
    super(`${operation}: ${message}`);
    this.kind = kind;
    this.operation = operation;
    this.status = status;
    this.reason = reason;
  }
}

/** What went wrong with a call to the API at `server`, as a KubeApiError whose message says what to fix. */
export function toKubeApiError(server: string, operation: string, err: unknown, timedOutAfterMs?: number): KubeApiError {
  if (err instanceof KubeApiError) return err;
  if (timedOutAfterMs !== undefined) {
    return new KubeApiError({
      kind: 'timeout',
      operation,
      message: `no answer from the Kubernetes API at ${server} within ${timedOutAfterMs} ms`,
    });
  }
  if (err instanceof ApiException) {
    return errorFromStatus(server, operation, err.code, typeof err.body === 'string' ? err.body : JSON.stringify(err.body ?? ''));
  }
  // undici's fetch (client-node 2) throws TypeError('fetch failed') with the socket's error as its cause.
  const e = (err instanceof TypeError && err.cause instanceof Error ? err.cause : err) as NodeJS.ErrnoException;
  const code = e?.code ?? (e as { errno?: string })?.errno;
  if (typeof code === 'string' && /CERT|SELF_SIGNED|UNABLE_TO_VERIFY|ALTNAME|TLS/i.test(code)) {
    return new KubeApiError({
      kind: 'unreachable',
      operation,
      message: `TLS to the Kubernetes API at ${server} failed (${e.message}): check the CA and server name in the kubeconfig`,
    });
  }
  if (typeof code === 'string' || e?.name === 'FetchError') {
    return new KubeApiError({ kind: 'unreachable', operation, message: `cannot reach the Kubernetes API at ${server}: ${e.message}` });
  }
  return new KubeApiError({ kind: 'client', operation, message: errorMessage(err) });
}

/** The error an HTTP status (and its Status body) from the API at `server` means. */
export function errorFromStatus(server: string, operation: string, code: number, body: string): KubeApiError {
  let message = '';
  let reason: string | undefined;
  try {
    const status = JSON.parse(body) as { message?: unknown; reason?: unknown };
    if (typeof status.message === 'string') message = status.message;
    if (typeof status.reason === 'string') reason = status.reason;
  } catch {
    message = body.slice(0, 200);
  }
  const said = message ? `: ${message}` : '';
  switch (code) {
    case 401:
      return new KubeApiError({
        kind: 'unauthorized',
        operation,
        message: `the Kubernetes API at ${server} rejected Kanal's credentials (401 Unauthorized${said}): check the user in --kubeconfig or the mounted service account`,
        status: code,
        reason,
      });
    case 403:
      return new KubeApiError({
        kind: 'forbidden',
        operation,
        message: `403 Forbidden${said}: grant it with the RBAC in deploy/rbac/`,
        status: code,
        reason,
      });
    case 404:
      return new KubeApiError({ kind: 'not-found', operation, message: `404 Not Found${said}`, status: code, reason });
    case 409:
      return new KubeApiError({ kind: 'conflict', operation, message: `409 Conflict${said}`, status: code, reason });
    case 410:
      return new KubeApiError({ kind: 'gone', operation, message: `410 Gone${said}`, status: code, reason });
    case 429:
      return new KubeApiError({
        kind: 'throttled',
        operation,
        message: `429 Too Many Requests from the Kubernetes API${said}`,
        status: code,
        reason,
      });
    default:
      if (code === 400 || code === 422)
        return new KubeApiError({ kind: 'invalid', operation, message: `${code} ${reason ?? 'Invalid'}${said}`, status: code, reason });
      return new KubeApiError({
        kind: 'server-error',
        operation,
        message: `HTTP ${code} from the Kubernetes API${said}`,
        status: code,
        reason,
      });
  }
}
