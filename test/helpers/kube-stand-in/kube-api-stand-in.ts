/**
 * A Kubernetes API server stand-in for the tests (no registry offers a
 * kube-apiserver here): HTTPS on 127.0.0.1 with its own throwaway CA,
 * kubeconfig files for client-certificate or bearer-token users, and the two
 * APIs Kanal uses, answered as the kube-apiserver answers them:
 * - POST /apis/authentication.k8s.io/v1/tokenreviews ({@link TokenAuthority});
 * - coordination.k8s.io/v1 Leases in any namespace: create, get, update,
 *   delete, list and watch with label selectors ({@link LeaseStore});
 * - authentication of the caller (401 for a bad credential, anonymous
 *   otherwise) and authorization, from RBAC manifests when given ({@link Rbac});
 * - failure injection: any status, delays, requests that never answer,
 *   connections reset, watches ended, cut or silently stalled, the whole
 *   server down and back on the same port.
 *
 * - JSON and protobuf (application/vnd.kubernetes.protobuf) bodies and
 *   answers, negotiated as the API server does ({@link ./protobuf.ts}): Kanal's
 *   client speaks JSON, upstream's client-go protobuf by default.
 */
import fs from 'node:fs/promises';
import https from 'node:https';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { TLSSocket } from 'node:tls';
import { createCertificateAuthority, type CertificateAuthority } from '../../../kit/pki/certificate-authority.js';
import { LabelSelector, LabelSyntaxError } from '../../../src/kube/labels.js';
import { LEASE_GROUP, LeaseStore, StatusError, type Lease, type LeaseWatcher, type WatchEventType } from './lease-store.js';
import { PROTOBUF, ProtobufError, decodeObject, encodeObject, encodeWatchFrame } from './protobuf.js';
import { forbiddenMessage, type Rbac } from './rbac.js';
import { TokenAuthority, type TokenUser } from './tokens.js';

const AUTHN_GROUP = 'authentication.k8s.io';
const JSON_TYPE = 'application/json';
type Encoding = typeof JSON_TYPE | typeof PROTOBUF;
const MAX_BODY = 3 * 1024 * 1024;

export type Verb = 'create' | 'get' | 'list' | 'watch' | 'update' | 'delete' | 'patch' | 'deletecollection';

export interface KubeApiStandInOptions {
  /** Directory for the CA, certificates and kubeconfigs. */
  dir: string;
  /** `--api-audiences` (default the in-cluster service URL). */
  apiAudiences?: string[];
  /** Authorization; without it every authenticated (not anonymous) user may do anything. */
  rbac?: Rbac;
  /** How often a watch with allowWatchBookmarks gets a BOOKMARK (default 60 s, as the kube-apiserver). */
  bookmarkIntervalMs?: number;
}

/** One request, recorded when it arrives; `status` is 0 until it is answered (a watch: until it ends). */
export interface RequestRecord {
  verb: Verb;
  resource: string;
  namespace?: string;
  name?: string;
  user: string;
  status: number;
  query: string;
}

export interface FaultMatch {
  verb?: Verb | Verb[];
  resource?: string;
  namespace?: string;
  name?: string;
  user?: string;
}

export type Fault =
  /** Answer this status with a Status body (reason and message default to the API's wording). */
  | { status: number; reason?: string; message?: string }
  /** Answer this status with this JSON body: a misbehaving or non-conforming API server. */
  | { status: number; body: unknown }
  /** Hold the request this long, then serve it normally. */
  | { delayMs: number }
  /** Never answer; the connection stays open until the client gives up or the stand-in stops. */
  | { hang: true }
  /** Reset the connection without an answer. */
  | { reset: true };

export interface FaultHandle {
  /** How many requests it hit. */
  readonly hits: number;
  clear(): void;
}

export interface KubeconfigUser {
  user: string;
  groups?: string[];
  /** A client certificate (CN = user), a static `token`, or one in a file (client-go's `tokenFile`). */
  auth: 'certificate' | 'token' | 'token-file';
}

interface Route {
  apiGroup: string;
  resource: 'leases' | 'tokenreviews';
  verb: Verb;
  namespace?: string;
  name?: string;
}

interface InjectedFault {
  match: FaultMatch;
  fault: Fault;
  remaining: number;
  hits: number;
}

interface OpenWatch extends LeaseWatcher {
  res: ServerResponse;
  stalled: boolean;
  close(how: 'end' | 'reset'): void;
}

const REASONS: Record<number, string> = {
  400: 'BadRequest',
  401: 'Unauthorized',
  403: 'Forbidden',
  404: 'NotFound',
  405: 'MethodNotAllowed',
  406: 'NotAcceptable',
  409: 'Conflict',
  410: 'Expired',
  413: 'RequestEntityTooLarge',
  415: 'UnsupportedMediaType',
  422: 'Invalid',
  429: 'TooManyRequests',
  500: 'InternalError',
  503: 'ServiceUnavailable',
  504: 'Timeout',
};

export class KubeApiStandIn {
  readonly tokens: TokenAuthority;
  readonly leases = new LeaseStore();
  /** Every request served, oldest first (bounded). */
  readonly requests: RequestRecord[] = [];
  readonly caFile: string;
  private readonly server: https.Server;
  private readonly sockets = new Set<Socket>();
  private readonly faults = new Set<InjectedFault>();
  private readonly watches = new Set<OpenWatch>();
  /** The media type each answer is in (negotiated from its request's Accept). */
  private readonly encodings = new WeakMap<ServerResponse, Encoding>();
  /** Groups of client-certificate users, by common name (our CA issues CN only). */
  private readonly certificateGroups = new Map<string, string[]>();
  private port = 0;
  private up = false;
  /** TLS connections accepted so far. */
  private accepted = 0;

  private constructor(
    private readonly options: KubeApiStandInOptions,
    private readonly ca: CertificateAuthority,
    serverCert: { certPem: string; keyPem: string },
  ) {
    this.tokens = new TokenAuthority(options.apiAudiences);
    this.caFile = path.join(options.dir, 'kube-ca.crt');
    this.server = https.createServer(
      { cert: serverCert.certPem, key: serverCert.keyPem, ca: ca.certPem, requestCert: true, rejectUnauthorized: false },
      (req, res) => {
        this.serve(req, res).catch((err: unknown) => this.answerStatus(res, new StatusError(500, 'InternalError', String(err))));
      },
    );
    this.server.on('secureConnection', (socket: TLSSocket) => {
      this.accepted++;
      this.track(socket);
    });
    this.server.on('connection', (socket: Socket) => this.track(socket));
  }

  static async start(options: KubeApiStandInOptions): Promise<KubeApiStandIn> {
    await fs.mkdir(options.dir, { recursive: true });
    const ca = await createCertificateAuthority('kube-api-stand-in-ca');
    const serverCert = await ca.issue({
      commonName: 'kube-apiserver',
      dnsNames: ['localhost', 'kubernetes.default.svc'],
      ipAddresses: ['127.0.0.1'],
      usage: 'server',
    });
    const api = new KubeApiStandIn(options, ca, serverCert);
    await fs.writeFile(api.caFile, ca.certPem);
    await api.comeBack();
    return api;
  }

  get url(): string {
    return `https://127.0.0.1:${this.port}`;
  }

  /** TLS connections accepted so far, and sockets open (a TLS connection counts its TCP socket too). */
  get connections(): { accepted: number; open: number } {
    return { accepted: this.accepted, open: this.sockets.size };
  }

  get openWatches(): number {
    return this.watches.size;
  }

  /** Writes a kubeconfig for `user` authenticating with a client certificate or a bearer token. */
  async writeKubeconfig(file: string, u: KubeconfigUser): Promise<string> {
    let userEntry: Record<string, string>;
    const base = path.join(path.dirname(file), path.basename(file).replace(/\W+/g, '-'));
    if (u.auth === 'certificate') {
      const cert = await this.ca.issue({ commonName: u.user, usage: 'client' });
      await fs.writeFile(`${base}.crt`, cert.certPem);
      await fs.writeFile(`${base}.key`, cert.keyPem, { mode: 0o600 });
      this.certificateGroups.set(u.user, u.groups ?? []);
      userEntry = { 'client-certificate': `${base}.crt`, 'client-key': `${base}.key` };
    } else {
      const token = randomBytes(24).toString('base64url');
      this.tokens.registerStaticToken(token, { username: u.user, groups: u.groups ?? [] });
      if (u.auth === 'token-file') {
        await fs.writeFile(`${base}.token`, token, { mode: 0o600 });
        userEntry = { tokenFile: `${base}.token` };
      } else {
        userEntry = { token };
      }
    }
    const config = {
      apiVersion: 'v1',
      kind: 'Config',
      clusters: [{ name: 'stand-in', cluster: { server: this.url, 'certificate-authority': this.caFile } }],
      users: [{ name: u.user, user: userEntry }],
      contexts: [{ name: 'stand-in', context: { cluster: 'stand-in', user: u.user } }],
      'current-context': 'stand-in',
    };
    await fs.writeFile(file, JSON.stringify(config, null, 2), { mode: 0o600 });
    return file;
  }

  /**
   * What a pod of `serviceAccount` sees: the mounted service account directory
   * (token for the API's audiences, ca.crt, namespace) and the environment.
   */
  async writeInClusterFiles(
    dir: string,
    sa: { namespace: string; serviceAccount: string },
  ): Promise<{ serviceAccountDir: string; env: NodeJS.ProcessEnv }> {
    await fs.mkdir(dir, { recursive: true });
    await fs.writeFile(path.join(dir, 'token'), this.tokens.issueServiceAccountToken(sa));
    await fs.writeFile(path.join(dir, 'ca.crt'), this.ca.certPem);
    await fs.writeFile(path.join(dir, 'namespace'), sa.namespace);
    return { serviceAccountDir: dir, env: { KUBERNETES_SERVICE_HOST: '127.0.0.1', KUBERNETES_SERVICE_PORT: String(this.port) } };
  }

  /** Injects `fault` into the next `times` matching requests (default: all until cleared). */
  injectFault(match: FaultMatch, fault: Fault, times = Infinity): FaultHandle {
    const entry: InjectedFault = { match, fault, remaining: times, hits: 0 };
    this.faults.add(entry);
    return {
      get hits() {
        return entry.hits;
      },
      clear: () => {
        this.faults.delete(entry);
      },
    };
  }

  clearFaults(): void {
    this.faults.clear();
  }

  /** Ends every open watch: cleanly ('end', as the API does at timeoutSeconds) or by resetting the connection. */
  dropWatches(how: 'end' | 'reset' = 'end'): number {
    const n = this.watches.size;
    for (const w of [...this.watches]) w.close(how);
    return n;
  }

  /** Open watches stop receiving anything (events, bookmarks) but stay open: a black-holed stream. */
  stallWatches(): number {
    for (const w of this.watches) w.stalled = true;
    return this.watches.size;
  }

  /** Stops listening and cuts every connection; {@link comeBack} listens again on the same port. */
  async goDown(): Promise<void> {
    if (!this.up) return;
    this.up = false;
    for (const w of [...this.watches]) w.close('reset');
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    for (const s of this.sockets) s.destroy();
    await closed;
  }

  async comeBack(): Promise<void> {
    if (this.up) return;
    await new Promise<void>((resolve, reject) => {
      this.server.once('error', reject);
      this.server.listen(this.port, '127.0.0.1', () => {
        this.server.off('error', reject);
        resolve();
      });
    });
    this.port = (this.server.address() as { port: number }).port;
    this.up = true;
  }

  async close(): Promise<void> {
    await this.goDown();
  }

  private track(socket: Socket): void {
    this.sockets.add(socket);
    socket.once('close', () => this.sockets.delete(socket));
  }

  private async serve(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'https://stand-in');
    const body = await readBody(req);
    const route = parseRoute(req.method ?? 'GET', url);
    const user = this.authenticate(req);
    const entry: RequestRecord = {
      verb: route?.verb ?? 'get',
      resource: route?.resource ?? url.pathname,
      ...(route?.namespace ? { namespace: route.namespace } : {}),
      ...(route?.name ? { name: route.name } : {}),
      user: user === 'invalid' ? '(invalid credential)' : user.username,
      status: 0,
      query: url.search,
    };
    this.requests.push(entry);
    if (this.requests.length > 10_000) this.requests.shift();
    res.once('close', () => (entry.status = res.headersSent ? res.statusCode : 0));
    const encoding = negotiate(req.headers.accept);
    if (!encoding) {
      return this.answerStatus(
        res,
        new StatusError(406, 'NotAcceptable', `only the following media types are accepted: ${JSON_TYPE}, ${PROTOBUF}`),
      );
    }
    this.encodings.set(res, encoding);
    if (body === undefined)
      return this.answerStatus(res, new StatusError(413, 'RequestEntityTooLarge', `request body larger than ${MAX_BODY} bytes`));
    if (!route) return this.answerStatus(res, new StatusError(404, 'NotFound', 'the server could not find the requested resource'));
    if (user === 'invalid') return this.answerStatus(res, new StatusError(401, 'Unauthorized', 'Unauthorized'));
    if (await this.applyFault(route, user.username, req, res)) return;
    const attributes = {
      user,
      verb: route.verb,
      apiGroup: route.apiGroup,
      resource: route.resource,
      ...(route.namespace ? { namespace: route.namespace } : {}),
      ...(route.name ? { name: route.name } : {}),
    };
    const allowed = this.options.rbac ? this.options.rbac.allows(attributes) : user.username !== 'system:anonymous';
    if (!allowed)
      return this.answerStatus(
        res,
        new StatusError(403, 'Forbidden', forbiddenMessage(attributes), {
          kind: route.resource,
          ...(route.name ? { name: route.name } : {}),
        }),
      );
    const contentType = (req.headers['content-type'] ?? '').split(';')[0].trim();
    if (body.length > 0 && contentType !== JSON_TYPE && contentType !== PROTOBUF) {
      return this.answerStatus(
        res,
        new StatusError(
          415,
          'UnsupportedMediaType',
          `the body of the request was in an unknown format - accepted media types include: ${JSON_TYPE}, ${PROTOBUF}`,
        ),
      );
    }
    try {
      const parsed: unknown =
        body.length === 0 ? undefined : contentType === PROTOBUF ? decodeObject(body) : JSON.parse(body.toString('utf8'));
      if (route.resource === 'tokenreviews') return this.reviewToken(res, parsed);
      return this.serveLeases(route, url, parsed, res);
    } catch (err) {
      if (err instanceof StatusError) return this.answerStatus(res, err);
      if (err instanceof SyntaxError || err instanceof LabelSyntaxError || err instanceof ProtobufError) {
        return this.answerStatus(res, new StatusError(400, 'BadRequest', err.message));
      }
      throw err;
    }
  }

  private authenticate(req: IncomingMessage): { username: string; groups: string[] } | 'invalid' {
    const authorization = req.headers.authorization;
    if (authorization) {
      const token = /^Bearer\s+(\S+)$/i.exec(authorization)?.[1];
      if (!token) return 'invalid';
      const result = this.tokens.authenticate(token);
      return result.authenticated ? { username: result.user.username, groups: result.user.groups } : 'invalid';
    }
    const socket = req.socket as TLSSocket;
    if (socket.authorized) {
      const cn = socket.getPeerCertificate().subject?.CN;
      if (typeof cn === 'string') return { username: cn, groups: [...(this.certificateGroups.get(cn) ?? []), 'system:authenticated'] };
    }
    return { username: 'system:anonymous', groups: ['system:unauthenticated'] };
  }

  /** True when the fault answered (or swallowed) the request. */
  private async applyFault(route: Route, user: string, req: IncomingMessage, res: ServerResponse): Promise<boolean> {
    for (const f of this.faults) {
      const m = f.match;
      const verbs = m.verb === undefined ? undefined : Array.isArray(m.verb) ? m.verb : [m.verb];
      if (verbs && !verbs.includes(route.verb)) continue;
      if (
        (m.resource && m.resource !== route.resource) ||
        (m.namespace && m.namespace !== route.namespace) ||
        (m.name && m.name !== route.name) ||
        (m.user && m.user !== user)
      )
        continue;
      f.hits++;
      if (--f.remaining <= 0) this.faults.delete(f);
      const fault = f.fault;
      if ('body' in fault) {
        this.answer(res, fault.status, fault.body);
        return true;
      }
      if ('status' in fault) {
        this.answerStatus(
          res,
          new StatusError(fault.status, fault.reason ?? REASONS[fault.status] ?? 'Unknown', fault.message ?? `injected ${fault.status}`),
        );
        return true;
      }
      if ('delayMs' in fault) {
        await new Promise((r) => setTimeout(r, fault.delayMs));
        return req.socket.destroyed; // the client gave up meanwhile
      }
      if ('reset' in fault) req.socket.destroy();
      return true; // hang: keep the socket, answer nothing
    }
    return false;
  }

  private reviewToken(res: ServerResponse, body: unknown): void {
    const review = (body ?? {}) as { apiVersion?: unknown; kind?: unknown; spec?: { token?: unknown; audiences?: unknown } };
    if (review.kind !== 'TokenReview' || (review.apiVersion !== `${AUTHN_GROUP}/v1` && review.apiVersion !== `${AUTHN_GROUP}/v1beta1`)) {
      throw new StatusError(
        400,
        'BadRequest',
        `the body is not a TokenReview (apiVersion ${String(review.apiVersion)}, kind ${String(review.kind)})`,
      );
    }
    const token = typeof review.spec?.token === 'string' ? review.spec.token : '';
    if (token === '') throw new StatusError(400, 'BadRequest', 'token is required for TokenReview in authentication');
    const audiences = Array.isArray(review.spec?.audiences) ? review.spec.audiences.map(String) : [];
    const result = this.tokens.authenticate(token, audiences);
    const status = result.authenticated
      ? { authenticated: true, user: userInfo(result.user), audiences: result.audiences }
      : { user: {}, error: result.error };
    this.answer(res, 201, {
      kind: 'TokenReview',
      apiVersion: review.apiVersion,
      metadata: { creationTimestamp: null },
      spec: review.spec,
      status,
    });
  }

  private serveLeases(route: Route, url: URL, body: unknown, res: ServerResponse): void {
    const ns = route.namespace;
    const selector = LabelSelector.parse(url.searchParams.get('labelSelector') ?? '', 'labelSelector');
    if (url.searchParams.get('fieldSelector')) throw new StatusError(400, 'BadRequest', 'the stand-in does not implement fieldSelector');
    switch (route.verb) {
      case 'list': {
        const { items, resourceVersion } = this.leases.list(ns, selector);
        return this.answer(res, 200, { kind: 'LeaseList', apiVersion: `${LEASE_GROUP}/v1`, metadata: { resourceVersion }, items });
      }
      case 'watch':
        return this.watchLeases(ns, selector, url, res);
      case 'get':
        return this.answer(res, 200, this.leases.get(ns!, route.name!));
      case 'create':
        return this.answer(res, 201, this.leases.create(ns!, body));
      case 'update':
        return this.answer(res, 200, this.leases.update(ns!, route.name!, body));
      case 'delete': {
        const options = (body ?? {}) as { preconditions?: { resourceVersion?: string; uid?: string } };
        const gone = this.leases.delete(ns!, route.name!, options.preconditions ?? {});
        return this.answer(res, 200, {
          kind: 'Status',
          apiVersion: 'v1',
          metadata: {},
          status: 'Success',
          details: { name: gone.metadata.name, group: LEASE_GROUP, kind: 'leases', uid: gone.metadata.uid },
        });
      }
      default:
        throw new StatusError(405, 'MethodNotAllowed', `the stand-in does not implement ${route.verb} on leases`);
    }
  }

  private watchLeases(namespace: string | undefined, selector: LabelSelector, url: URL, res: ServerResponse): void {
    const protobuf = this.encodings.get(res) === PROTOBUF;
    res.writeHead(200, { 'Content-Type': protobuf ? `${PROTOBUF};stream=watch` : JSON_TYPE, 'Cache-Control': 'no-cache, private' });
    res.flushHeaders();
    const write = (type: WatchEventType | 'BOOKMARK' | 'ERROR', object: Record<string, unknown>): void => {
      if (watch.stalled || res.writableEnded) return;
      res.write(protobuf ? encodeWatchFrame(type, object) : `${JSON.stringify({ type, object })}\n`);
    };
    const timers: NodeJS.Timeout[] = [];
    let unregister = (): void => {};
    const watch: OpenWatch = {
      namespace,
      selector,
      res,
      stalled: false,
      send: (type: WatchEventType, lease: Lease) => write(type, { ...lease }),
      close: (how) => {
        cleanup();
        if (how === 'reset') res.socket?.destroy();
        else res.end();
      },
    };
    const cleanup = (): void => {
      unregister();
      for (const t of timers) clearTimeout(t);
      this.watches.delete(watch);
    };
    // The streaming list (client-go's WatchListClient): the state as ADDED events, then a bookmark marking its end.
    const initialEvents = url.searchParams.get('sendInitialEvents') === 'true';
    const bookmarks = url.searchParams.get('allowWatchBookmarks') === 'true';
    if (initialEvents && !bookmarks) {
      write('ERROR', statusObject(new StatusError(422, 'Invalid', 'sendInitialEvents requires allowWatchBookmarks=true')));
      res.end();
      return;
    }
    try {
      unregister = this.leases.watch(watch, initialEvents ? '' : (url.searchParams.get('resourceVersion') ?? ''));
    } catch (err) {
      if (!(err instanceof StatusError)) throw err;
      write('ERROR', statusObject(err));
      res.end();
      return;
    }
    if (initialEvents) {
      write('BOOKMARK', {
        kind: 'Lease',
        apiVersion: `${LEASE_GROUP}/v1`,
        metadata: { resourceVersion: this.leases.resourceVersion, annotations: { 'k8s.io/initial-events-end': 'true' } },
      });
    }
    this.watches.add(watch);
    res.once('close', cleanup);
    const timeoutSeconds = Number(url.searchParams.get('timeoutSeconds') ?? 0);
    if (timeoutSeconds > 0) timers.push(setTimeout(() => watch.close('end'), timeoutSeconds * 1000));
    if (bookmarks) {
      const bookmark = (): void => {
        write('BOOKMARK', { kind: 'Lease', apiVersion: `${LEASE_GROUP}/v1`, metadata: { resourceVersion: this.leases.resourceVersion } });
        timers.push(setTimeout(bookmark, this.options.bookmarkIntervalMs ?? 60_000));
      };
      timers.push(setTimeout(bookmark, this.options.bookmarkIntervalMs ?? 60_000));
    }
  }

  private answer(res: ServerResponse, code: number, object: unknown): void {
    if (res.headersSent) return;
    const protobuf = this.encodings.get(res) === PROTOBUF;
    const data = protobuf ? encodeObject(object as Record<string, unknown>) : Buffer.from(JSON.stringify(object));
    res.writeHead(code, { 'Content-Type': protobuf ? PROTOBUF : JSON_TYPE, 'Content-Length': data.length });
    res.end(data);
  }

  private answerStatus(res: ServerResponse, err: StatusError): void {
    this.answer(res, err.code, statusObject(err));
  }
}

function statusObject(err: StatusError): Record<string, unknown> {
  return {
    kind: 'Status',
    apiVersion: 'v1',
    metadata: {},
    status: 'Failure',
    message: err.message,
    reason: err.reason,
    ...(err.details ? { details: err.details } : {}),
    code: err.code,
  };
}

function userInfo(user: Required<TokenUser>): Record<string, unknown> {
  return {
    username: user.username,
    uid: user.uid,
    groups: user.groups,
    ...(Object.keys(user.extra).length > 0 ? { extra: user.extra } : {}),
  };
}

/** Undefined when the body exceeds {@link MAX_BODY}. */
async function readBody(req: IncomingMessage): Promise<Buffer | undefined> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > MAX_BODY) return undefined;
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks);
}

/**
 * The answer's media type from the Accept header, as the API server picks it:
 * the highest quality it serves, the first listed among equals, JSON for
 * wildcards; undefined when it serves none of them (406).
 */
function negotiate(accept: string | undefined): Encoding | undefined {
  if (!accept) return JSON_TYPE;
  let best: { encoding: Encoding; q: number } | undefined;
  for (const part of accept.split(',')) {
    const [type, ...params] = part.split(';').map((x) => x.trim());
    const q = Number(params.find((p) => p.startsWith('q='))?.slice(2) ?? 1);
    const encoding =
      type === PROTOBUF ? PROTOBUF : type === JSON_TYPE || type === '*/*' || type === 'application/*' ? JSON_TYPE : undefined;
    if (encoding && q > 0 && (!best || q > best.q)) best = { encoding, q };
  }
  return best?.encoding;
}

function parseRoute(method: string, url: URL): Route | undefined {
  const p = url.pathname.replace(/\/+$/, '');
  if (p === `/apis/${AUTHN_GROUP}/v1/tokenreviews` || p === `/apis/${AUTHN_GROUP}/v1beta1/tokenreviews`) {
    return method === 'POST' ? { apiGroup: AUTHN_GROUP, resource: 'tokenreviews', verb: 'create' } : undefined;
  }
  const m = new RegExp(`^/apis/${LEASE_GROUP.replace(/\./g, '\\.')}/v1(?:/namespaces/([^/]+))?/leases(?:/([^/]+))?$`).exec(p);
  if (!m) return undefined;
  const [, namespace, name] = m;
  if (name && !namespace) return undefined;
  const watch = url.searchParams.get('watch') === 'true' || url.searchParams.get('watch') === '1';
  const verbs: Record<string, Verb | undefined> = name
    ? { GET: watch ? 'watch' : 'get', PUT: 'update', DELETE: 'delete', PATCH: 'patch' }
    : { GET: watch ? 'watch' : 'list', POST: namespace ? 'create' : undefined, DELETE: namespace ? 'deletecollection' : undefined };
  const verb = verbs[method];
  if (!verb) return undefined;
  return {
    apiGroup: LEASE_GROUP,
    resource: 'leases',
    verb,
    ...(namespace ? { namespace: decodeURIComponent(namespace) } : {}),
    ...(name ? { name: decodeURIComponent(name) } : {}),
  };
}
