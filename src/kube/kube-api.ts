/**
 * Kanal's client of the Kubernetes API (@kubernetes/client-node underneath),
 * with the limits a dependency that may be down or slow needs: every call has
 * a deadline covering its wait for a slot, the client-side rate limit
 * (`--kubeconfig-qps`/`--kubeconfig-burst`, client-go semantics) and the HTTP
 * exchange; calls in flight and calls waiting are bounded; every failure is
 * a {@link KubeApiError} whose message says what to fix.
 */
import { createHash } from 'node:crypto';
import type http from 'node:http';
import https from 'node:https';
import type { IncomingMessage } from 'node:http';
import {
  ApiException,
  AuthenticationV1Api,
  CoordinationV1Api,
  IsomorphicFetchHttpLibrary,
  type ConfigurationOptions,
  type HttpLibrary,
  type KubeConfig,
  type RequestContext,
  type ResponseContext,
  type Observable,
} from '@kubernetes/client-node';
import { errorMessage } from '../common/error-message.js';
import { RequestSlots, SlotsUnavailableError } from './request-slots.js';
import { TokenBucket } from './token-bucket.js';

import { JSON_CONTENT_TYPE, PROTOBUF_CONTENT_TYPE } from './content-types.js';

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

export class KubeApiError extends Error {
  override readonly name = 'KubeApiError';
  constructor(
    readonly kind: KubeApiErrorKind,
    /** What was attempted, e.g. `update lease kube-system/x`. */
    readonly operation: string,
    message: string,
    /** HTTP status when the API answered. */
    readonly status?: number,
    /** The Status `reason` the API gave (Conflict, AlreadyExists, Expired, ...). */
    readonly reason?: string,
  ) {
    super(`${operation}: ${message}`);
  }
}

export interface KubeApiOptions {
  kubeConfig: KubeConfig;
  /** `--kubeconfig-qps`: 0 → 5 (client-go), negative → unlimited. */
  qps?: number;
  /** `--kubeconfig-burst`: 0 → 10 (client-go). */
  burst?: number;
  /** `--kube-api-content-type` (default protobuf, as upstream); see {@link KubeApi.contentTypeNotice}. */
  contentType?: string;
  /** Default deadline of one call, queueing included (default 10 s). */
  timeoutMs?: number;
  /** Calls in flight at once (default 16). */
  maxInFlight?: number;
  /** Calls waiting for a slot (default 256); more are refused at once. */
  maxWaiting?: number;
}

export interface CallOptions {
  /** Overrides {@link KubeApiOptions.timeoutMs} for this call. */
  timeoutMs?: number;
}

export class KubeApi {
  readonly server: string;
  /**
   * client-node encodes and decodes JSON only; every API server serves JSON,
   * so a protobuf `--kube-api-content-type` changes the wire encoding, not
   * the meaning. Set when that applies, for the caller to log once.
   */
  readonly contentTypeNotice: string | undefined;
  readonly coordination: CoordinationV1Api;
  readonly authentication: AuthenticationV1Api;
  private readonly kubeConfig: KubeConfig;
  private readonly rate: TokenBucket;
  private readonly slots: RequestSlots;
  private readonly timeoutMs: number;
  private readonly agents: KeptAliveAgent;

  constructor(options: KubeApiOptions) {
    this.kubeConfig = options.kubeConfig;
    const cluster = options.kubeConfig.getCurrentCluster();
    if (!cluster) throw new Error('KubeApi: the kubeconfig has no current cluster');
    this.server = cluster.server;
    const contentType = options.contentType ?? PROTOBUF_CONTENT_TYPE;
    if (contentType !== PROTOBUF_CONTENT_TYPE && contentType !== JSON_CONTENT_TYPE) {
      throw new RangeError(`--kube-api-content-type ${JSON.stringify(contentType)}: use ${PROTOBUF_CONTENT_TYPE} or ${JSON_CONTENT_TYPE}`);
    }
    this.contentTypeNotice =
      contentType === PROTOBUF_CONTENT_TYPE
        ? `--kube-api-content-type=${PROTOBUF_CONTENT_TYPE}: Kanal's Kubernetes client (@kubernetes/client-node) speaks ${JSON_CONTENT_TYPE}, which every API server serves; requests use JSON`
        : undefined;
    this.rate = new TokenBucket(options.qps ?? 0, options.burst ?? 0);
    this.slots = new RequestSlots(options.maxInFlight ?? 16, options.maxWaiting ?? 256);
    this.agents = new KeptAliveAgent(this.slots.limit);
    this.timeoutMs = options.timeoutMs ?? 10_000;
    this.coordination = options.kubeConfig.makeApiClient(CoordinationV1Api);
    this.authentication = options.kubeConfig.makeApiClient(AuthenticationV1Api);
  }

  /** Effective client-side limit, for logs: client-go's defaults filled in. */
  get limits(): { qps: number; burst: number; maxInFlight: number; maxWaiting: number } {
    return { qps: this.rate.qps, burst: this.rate.burst, maxInFlight: this.slots.limit, maxWaiting: this.slots.maxWaiting };
  }

  stats(): { inFlight: number; waiting: number } {
    return { inFlight: this.slots.inUse, waiting: this.slots.waiting };
  }

  /** Closes the kept-alive connections (calls after this open new ones). */
  close(): void {
    this.agents.close();
  }

  /**
   * Runs one API call: `fn` must pass the given options to the client-node
   * method so the call is aborted at its deadline.
   */
  async call<T>(operation: string, fn: (options: ConfigurationOptions) => Promise<T>, callOptions: CallOptions = {}): Promise<T> {
    const timeoutMs = callOptions.timeoutMs ?? this.timeoutMs;
    const deadline = performance.now() + timeoutMs;
    let release: () => void;
    try {
      release = await this.slots.acquire(timeoutMs);
    } catch (err) {
      if (err instanceof SlotsUnavailableError) {
        throw new KubeApiError(
          err.why === 'queue-full' ? 'overloaded' : 'timeout',
          operation,
          `Kubernetes API client busy: ${err.message}`,
        );
      }
      throw err;
    }
    try {
      await this.waitForRate(operation, deadline - performance.now());
      const signal = AbortSignal.timeout(Math.max(1, Math.ceil(deadline - performance.now())));
      try {
        return await fn({ httpApi: new AbortableHttpLibrary(signal, this.agents) });
      } catch (err) {
        throw this.toError(operation, err, signal.aborted ? timeoutMs : undefined);
      }
    } finally {
      release();
    }
  }

  /**
   * Opens a watch (`?watch=true`) and hands each event to `onEvent`; `onEnd`
   * runs exactly once: without an error when the API ended the stream, with
   * one otherwise. Lines longer than `maxLineBytes` end the watch: a broken or
   * hostile API cannot make us buffer without bound.
   */
  watch(path: string, query: Readonly<Record<string, string>>, handlers: WatchHandlers, maxLineBytes = 1 << 20): WatchHandle {
    const operation = `watch ${path}`;
    let ended = false;
    let request: ReturnType<typeof https.request> | undefined;
    const end = (err?: KubeApiError): void => {
      if (ended) return;
      ended = true;
      request?.destroy();
      handlers.onEnd(err);
    };
    const start = async (): Promise<void> => {
      await this.waitForRate(operation, this.timeoutMs);
      const url = new URL(this.server + path);
      for (const [k, v] of Object.entries({ ...query, watch: 'true' })) url.searchParams.set(k, v);
      const opts: https.RequestOptions = { method: 'GET', headers: {} };
      await this.kubeConfig.applyToHTTPSOptions(opts);
      if (ended) return;
      request = https.request(url, { ...opts, headers: { ...opts.headers, Accept: JSON_CONTENT_TYPE } });
      request.on('error', (err) => end(this.toError(operation, err)));
      request.on('response', (res) => this.readWatch(operation, res, handlers, maxLineBytes, end));
      request.end();
    };
    start().catch((err: unknown) => end(err instanceof KubeApiError ? err : this.toError(operation, err)));
    return { stop: () => end() };
  }

  private readWatch(
    operation: string,
    res: IncomingMessage,
    handlers: WatchHandlers,
    maxLineBytes: number,
    end: (err?: KubeApiError) => void,
  ): void {
    if (res.statusCode !== 200) {
      const chunks: Buffer[] = [];
      let size = 0;
      res.on('data', (c: Buffer) => {
        if (size < 64 * 1024) chunks.push(c);
        size += c.length;
      });
      res.on('end', () => end(this.fromStatus(operation, res.statusCode ?? 0, Buffer.concat(chunks).toString('utf8'))));
      res.on('error', (err) => end(this.toError(operation, err)));
      return;
    }
    let pending = '';
    const tooLong = (text: string): boolean => {
      if (Buffer.byteLength(text) <= maxLineBytes) return false;
      end(new KubeApiError('invalid', operation, `watch event longer than ${maxLineBytes} bytes`));
      return true;
    };
    res.setEncoding('utf8');
    res.on('data', (chunk: string) => {
      pending += chunk;
      let nl: number;
      while ((nl = pending.indexOf('\n')) >= 0) {
        const line = pending.slice(0, nl).trim();
        pending = pending.slice(nl + 1);
        if (tooLong(line) || (line && !this.dispatch(operation, line, handlers, end))) return;
      }
      tooLong(pending);
    });
    res.on('end', () => end());
    res.on('error', (err) => end(this.toError(operation, err)));
    res.on('close', () => end(res.complete ? undefined : new KubeApiError('unreachable', operation, 'watch stream cut before its end')));
  }

  /** False when the watch ended (bad event or an ERROR event). */
  private dispatch(operation: string, line: string, handlers: WatchHandlers, end: (err?: KubeApiError) => void): boolean {
    let event: { type?: unknown; object?: unknown };
    try {
      event = JSON.parse(line) as { type?: unknown; object?: unknown };
    } catch {
      end(new KubeApiError('invalid', operation, `watch event is not JSON: ${line.slice(0, 200)}`));
      return false;
    }
    if (event.type === 'ERROR') {
      // The API reports a failed watch (410 Expired: resourceVersion too old) as an event.
      end(this.fromStatus(operation, statusCode(event.object) ?? 500, JSON.stringify(event.object)));
      return false;
    }
    if (typeof event.type !== 'string' || typeof event.object !== 'object' || event.object === null) {
      end(new KubeApiError('invalid', operation, `malformed watch event: ${line.slice(0, 200)}`));
      return false;
    }
    handlers.onEvent(event.type, event.object);
    return true;
  }

  private async waitForRate(operation: string, maxWaitMs: number): Promise<void> {
    const delay = this.rate.reserve(Math.max(0, maxWaitMs));
    if (delay === undefined) {
      throw new KubeApiError(
        'overloaded',
        operation,
        `client-side rate limit (--kubeconfig-qps=${this.rate.qps}, --kubeconfig-burst=${this.rate.burst}) would delay the request past its deadline`,
      );
    }
    if (delay > 0) await new Promise((r) => setTimeout(r, delay));
  }

  private toError(operation: string, err: unknown, timedOutAfterMs?: number): KubeApiError {
    if (err instanceof KubeApiError) return err;
    if (timedOutAfterMs !== undefined) {
      return new KubeApiError('timeout', operation, `no answer from the Kubernetes API at ${this.server} within ${timedOutAfterMs} ms`);
    }
    if (err instanceof ApiException) {
      return this.fromStatus(operation, err.code, typeof err.body === 'string' ? err.body : JSON.stringify(err.body ?? ''));
    }
    const e = err as NodeJS.ErrnoException;
    const code = e?.code ?? (e as { errno?: string })?.errno;
    if (typeof code === 'string' && /CERT|SELF_SIGNED|UNABLE_TO_VERIFY|ALTNAME|TLS/i.test(code)) {
      return new KubeApiError(
        'unreachable',
        operation,
        `TLS to the Kubernetes API at ${this.server} failed (${e.message}): check the CA and server name in the kubeconfig`,
      );
    }
    if (typeof code === 'string' || e?.name === 'FetchError') {
      return new KubeApiError('unreachable', operation, `cannot reach the Kubernetes API at ${this.server}: ${e.message}`);
    }
    return new KubeApiError('client', operation, errorMessage(err));
  }

  private fromStatus(operation: string, code: number, body: string): KubeApiError {
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
        return new KubeApiError(
          'unauthorized',
          operation,
          `the Kubernetes API at ${this.server} rejected Kanal's credentials (401 Unauthorized${said}): check the user in --kubeconfig or the mounted service account`,
          code,
          reason,
        );
      case 403:
        return new KubeApiError('forbidden', operation, `403 Forbidden${said}: grant it with the RBAC in deploy/rbac/`, code, reason);
      case 404:
        return new KubeApiError('not-found', operation, `404 Not Found${said}`, code, reason);
      case 409:
        return new KubeApiError('conflict', operation, `409 Conflict${said}`, code, reason);
      case 410:
        return new KubeApiError('gone', operation, `410 Gone${said}`, code, reason);
      case 429:
        return new KubeApiError('throttled', operation, `429 Too Many Requests from the Kubernetes API${said}`, code, reason);
      default:
        if (code === 400 || code === 422)
          return new KubeApiError('invalid', operation, `${code} ${reason ?? 'Invalid'}${said}`, code, reason);
        return new KubeApiError('server-error', operation, `HTTP ${code} from the Kubernetes API${said}`, code, reason);
    }
  }
}

export interface WatchHandlers {
  onEvent(type: string, object: object): void;
  onEnd(err?: KubeApiError): void;
}

export interface WatchHandle {
  /** Closes the stream; `onEnd` runs (without an error) if it had not yet. */
  stop(): void;
}

function statusCode(object: unknown): number | undefined {
  const code = typeof object === 'object' && object !== null ? (object as { code?: unknown }).code : undefined;
  return typeof code === 'number' ? code : undefined;
}

/**
 * client-node's fetch library, with every request bound to one abort signal
 * (the call's deadline) and sent over the client's kept-alive connections.
 */
class AbortableHttpLibrary implements HttpLibrary {
  private readonly inner = new IsomorphicFetchHttpLibrary();
  constructor(
    private readonly signal: AbortSignal,
    private readonly agents: KeptAliveAgent,
  ) {}

  send(request: RequestContext): Observable<ResponseContext> {
    request.setSignal(this.signal);
    const agent = this.agents.for(request.getAgent());
    if (agent) request.setAgent(agent);
    return this.inner.send(request);
  }
}

/**
 * client-node builds a new https.Agent for every request, so every call paid
 * a TLS handshake. This keeps one kept-alive agent per set of TLS options
 * (client-node re-reads the credential files per request, so a rotated
 * certificate yields new options and a new agent; the old one's idle sockets
 * time out). Proxy agents are left as they are.
 */
class KeptAliveAgent {
  private current: { key: string; agent: https.Agent } | undefined;

  constructor(private readonly maxSockets: number) {}

  for(fresh: http.Agent | https.Agent | undefined): https.Agent | undefined {
    if (!fresh || Object.getPrototypeOf(fresh) !== https.Agent.prototype) return undefined;
    const o = (fresh as https.Agent).options;
    const key = createHash('sha256')
      .update(
        JSON.stringify(
          [o.ca, o.cert, o.key, o.pfx, o.passphrase, o.rejectUnauthorized, o.servername].map((v) =>
            Buffer.isBuffer(v) ? v.toString('base64') : v,
          ),
        ),
      )
      .digest('hex');
    if (this.current?.key !== key) {
      this.current = {
        key,
        agent: new https.Agent({ ...o, keepAlive: true, maxSockets: this.maxSockets, maxFreeSockets: this.maxSockets, timeout: 60_000 }),
      };
    }
    return this.current.agent;
  }

  close(): void {
    this.current?.agent.destroy();
    this.current = undefined;
  }
}
