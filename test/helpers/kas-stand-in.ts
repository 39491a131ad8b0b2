// A kube-apiserver stand-in for the node -> control plane tests: just enough
// of the API for kubectl (version, discovery, one configmap, namespaces) over
// HTTPS with a certificate for the advertise address. It runs as its own
// process inside the control-plane namespace:
//
//   node kas-stand-in.js '{"host":"10.250.1.1","port":6443,"cert":"...","key":"...","advertise":"10.96.0.1:6443"}'
//
// Every request is reported on stdout as {"event":"request",...} so tests can
// see who connected (the Kanal server, not the node) and what was asked.

import fs from 'node:fs';
import https from 'node:https';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { fileURLToPath } from 'node:url';

export interface KasStandInSpec {
  host: string;
  port: number;
  cert: string;
  key: string;
  /** host:port clients were told to use (serverAddressByClientCIDRs). */
  advertise: string;
}

export const KAS_GIT_VERSION = 'v1.31.4-kanal-kas-stand-in';
export const CONFIGMAP_NAME = 'kanal-greeting';
export const CONFIGMAP_DATA = { greeting: 'hello from the control plane' };

const STARTED = new Date();

export const VERSION = {
  major: '1',
  minor: '31',
  gitVersion: KAS_GIT_VERSION,
  gitCommit: '0000000000000000000000000000000000000000',
  gitTreeState: 'clean',
  buildDate: '2026-01-01T00:00:00Z',
  goVersion: 'go1.22.10',
  compiler: 'gc',
  platform: 'linux/amd64',
};

function metadata(name: string, namespace?: string): Record<string, unknown> {
  return {
    name,
    ...(namespace ? { namespace } : {}),
    uid: `00000000-0000-4000-8000-${Buffer.from(name).toString('hex').padEnd(12, '0').slice(0, 12)}`,
    resourceVersion: '1',
    creationTimestamp: STARTED.toISOString().replace(/\.\d+Z$/, 'Z'),
  };
}

const CONFIGMAP = { kind: 'ConfigMap', apiVersion: 'v1', metadata: metadata(CONFIGMAP_NAME, 'default'), data: CONFIGMAP_DATA };
const NAMESPACES = ['default', 'kube-system'].map((n) => ({
  kind: 'Namespace',
  apiVersion: 'v1',
  metadata: metadata(n),
  spec: { finalizers: ['kubernetes'] },
  status: { phase: 'Active' },
}));

function age(): string {
  return `${Math.max(0, Math.round((Date.now() - STARTED.getTime()) / 1000))}s`;
}

/** meta.k8s.io/v1 Table, which kubectl asks for when it prints a list. */
function table(columns: [string, string][], rows: { cells: unknown[]; object: { metadata: Record<string, unknown> } }[]): unknown {
  return {
    kind: 'Table',
    apiVersion: 'meta.k8s.io/v1',
    metadata: { resourceVersion: '1' },
    columnDefinitions: columns.map(([name, type], i) => ({ name, type, format: i === 0 ? 'name' : '', description: name, priority: 0 })),
    rows: rows.map((r) => ({
      cells: r.cells,
      object: { kind: 'PartialObjectMetadata', apiVersion: 'meta.k8s.io/v1', metadata: r.object.metadata },
    })),
  };
}

function list(kind: string, items: unknown[]): unknown {
  return { kind, apiVersion: 'v1', metadata: { resourceVersion: '1' }, items };
}

const API_RESOURCES = {
  kind: 'APIResourceList',
  groupVersion: 'v1',
  resources: [
    { name: 'configmaps', singularName: 'configmap', namespaced: true, kind: 'ConfigMap', verbs: ['get', 'list'], shortNames: ['cm'] },
    { name: 'namespaces', singularName: 'namespace', namespaced: false, kind: 'Namespace', verbs: ['get', 'list'], shortNames: ['ns'] },
  ],
};

function notFound(path: string): unknown {
  return {
    kind: 'Status',
    apiVersion: 'v1',
    metadata: {},
    status: 'Failure',
    message: `the server could not find the requested resource (${path})`,
    reason: 'NotFound',
    details: {},
    code: 404,
  };
}

function answer(spec: KasStandInSpec, req: IncomingMessage): { status: number; body: unknown } {
  const url = new URL(req.url ?? '/', 'https://kas.invalid');
  const wantsTable = /as=Table/.test(req.headers.accept ?? '');
  if (req.method !== 'GET') {
    return {
      status: 405,
      body: {
        kind: 'Status',
        apiVersion: 'v1',
        metadata: {},
        status: 'Failure',
        message: 'read-only stand-in',
        reason: 'MethodNotAllowed',
        code: 405,
      },
    };
  }
  switch (url.pathname) {
    case '/version':
      return { status: 200, body: VERSION };
    case '/healthz':
    case '/readyz':
    case '/livez':
      return { status: 200, body: 'ok' };
    case '/api':
      return {
        status: 200,
        body: {
          kind: 'APIVersions',
          versions: ['v1'],
          serverAddressByClientCIDRs: [{ clientCIDR: '0.0.0.0/0', serverAddress: spec.advertise }],
        },
      };
    case '/apis':
      return { status: 200, body: { kind: 'APIGroupList', apiVersion: 'v1', groups: [] } };
    case '/api/v1':
      return { status: 200, body: API_RESOURCES };
    case '/api/v1/namespaces/default/configmaps':
      return {
        status: 200,
        body: wantsTable
          ? table(
              [
                ['Name', 'string'],
                ['Data', 'integer'],
                ['Age', 'string'],
              ],
              [{ cells: [CONFIGMAP_NAME, Object.keys(CONFIGMAP_DATA).length, age()], object: CONFIGMAP }],
            )
          : list('ConfigMapList', [CONFIGMAP]),
      };
    case `/api/v1/namespaces/default/configmaps/${CONFIGMAP_NAME}`:
      return { status: 200, body: CONFIGMAP };
    case '/api/v1/namespaces':
      return {
        status: 200,
        body: wantsTable
          ? table(
              [
                ['Name', 'string'],
                ['Status', 'string'],
                ['Age', 'string'],
              ],
              NAMESPACES.map((n) => ({ cells: [n.metadata.name, 'Active', age()], object: n })),
            )
          : list('NamespaceList', NAMESPACES),
      };
    default:
      return { status: 404, body: notFound(url.pathname) };
  }
}

export function startKasStandIn(spec: KasStandInSpec, onRequest?: (event: Record<string, unknown>) => void): Promise<https.Server> {
  const server = https.createServer(
    { cert: fs.readFileSync(spec.cert), key: fs.readFileSync(spec.key) },
    (req: IncomingMessage, res: ServerResponse) => {
      const { status, body } = answer(spec, req);
      onRequest?.({
        event: 'request',
        method: req.method,
        url: req.url,
        status,
        peer: `${req.socket.remoteAddress}:${req.socket.remotePort}`,
        userAgent: req.headers['user-agent'],
      });
      const text = typeof body === 'string' ? body : JSON.stringify(body);
      res
        .writeHead(status, {
          'content-type': typeof body === 'string' ? 'text/plain' : 'application/json',
          'cache-control': 'no-cache, private',
        })
        .end(text);
    },
  );
  server.on('tlsClientError', (err) => onRequest?.({ event: 'tls-error', message: err.message }));
  return new Promise<https.Server>((resolve, reject) => {
    server.once('error', reject);
    server.listen({ host: spec.host, port: spec.port }, () => {
      server.off('error', reject);
      resolve(server);
    });
  });
}

function emit(event: Record<string, unknown>): void {
  process.stdout.write(`${JSON.stringify({ time: new Date().toISOString(), ...event })}\n`);
}

if (process.argv[1] && fs.realpathSync(process.argv[1]) === fs.realpathSync(fileURLToPath(import.meta.url))) {
  const spec = JSON.parse(process.argv[2] ?? '{}') as KasStandInSpec;
  startKasStandIn(spec, emit).then(
    () => emit({ event: 'ready', listen: `${spec.host}:${spec.port}` }),
    (err: Error) => {
      emit({ event: 'error', message: err.message });
      process.exit(1);
    },
  );
  const bye = (): void => process.exit(0);
  process.on('SIGTERM', bye);
  process.on('SIGINT', bye);
}
