/**
 * Kanal's client of the Kubernetes API (@kubernetes/client-node underneath),
 * with the limits a dependency that may be down or slow needs: every call has
 * a deadline covering its wait for a slot, the client-side rate limit
 * (`--kubeconfig-qps`/`--kubeconfig-burst`, client-go semantics) and the HTTP
 * exchange; calls in flight and calls waiting are bounded; every failure is
 * a {@link KubeApiError} whose message says what to fix.
 */
import https from 'node:https';
import { AuthenticationV1Api, CoordinationV1Api, type ConfigurationOptions, type KubeConfig } from '@kubernetes/client-node';
import { RequestSlots, SlotsUnavailableError } from './request-slots.js';
import { TokenBucket } from './token-bucket.js';
import { JSON_CONTENT_TYPE, PROTOBUF_CONTENT_TYPE } from './content-types.js';
import { KubeApiError, toKubeApiError } from './kube-api-error.js';
import { readWatch, type WatchHandle, type WatchHandlers } from './watch-stream.js';
import { AbortableHttpLibrary, KeptAliveAgent } from './kept-alive-agent.js';

// The setting these messages name, spelt once here: both commands' tables use this module, which sits below them in the layers.
const KUBE_API_CONTENT_TYPE = '--kube-api-content-type';

export { KubeApiError, type KubeApiErrorKind } from './kube-api-error.js';
export type { WatchHandle, WatchHandlers } from './watch-stream.js';

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
      throw new RangeError(`${KUBE_API_CONTENT_TYPE} ${JSON.stringify(contentType)}: use ${PROTOBUF_CONTENT_TYPE} or ${JSON_CONTENT_TYPE}`);
    }
    this.contentTypeNotice =
      contentType === PROTOBUF_CONTENT_TYPE
        ? `${KUBE_API_CONTENT_TYPE}=${PROTOBUF_CONTENT_TYPE}: Kanal's Kubernetes client (@kubernetes/client-node) speaks ${JSON_CONTENT_TYPE}, which every API server serves; requests use JSON`
        : undefined;
    this.rate = new TokenBucket(options.qps ?? 0, options.burst ?? 0);
    this.slots = new RequestSlots(options.maxInFlight ?? 16, options.maxWaiting ?? 256);
    this.agents = new KeptAliveAgent(options.kubeConfig, this.slots.limit);
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
        throw new KubeApiError({
          kind: err.why === 'queue-full' ? 'overloaded' : 'timeout',
          operation,
          message: `Kubernetes API client busy: ${err.message}`,
        });
      }
      throw err;
    }
    try {
      await this.waitForRate(operation, deadline - performance.now());
      const signal = AbortSignal.timeout(Math.max(1, Math.ceil(deadline - performance.now())));
      try {
        return await fn({ httpApi: new AbortableHttpLibrary(signal), authMethods: { default: this.agents } });
      } catch (err) {
        throw toKubeApiError(this.server, operation, err, signal.aborted ? timeoutMs : undefined);
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
      request.on('error', (err) => end(toKubeApiError(this.server, operation, err)));
      request.on('response', (res) => readWatch(res, { server: this.server, operation, handlers, maxLineBytes, end }));
      request.end();
    };
    start().catch((err: unknown) => end(err instanceof KubeApiError ? err : toKubeApiError(this.server, operation, err)));
    return { stop: () => end() };
  }

  private async waitForRate(operation: string, maxWaitMs: number): Promise<void> {
    const delay = this.rate.reserve(Math.max(0, maxWaitMs));
    if (delay === undefined) {
      throw new KubeApiError({
        kind: 'overloaded',
        operation,
        message: `client-side rate limit (--kubeconfig-qps=${this.rate.qps}, --kubeconfig-burst=${this.rate.burst}) would delay the request past its deadline`,
      });
    }
    if (delay > 0) await new Promise((r) => setTimeout(r, delay));
  }
}
