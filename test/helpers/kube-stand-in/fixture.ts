/**
 * Test fixtures around the Kubernetes API stand-in: one per test, torn down
 * with it; Kanal clients (KubeApi) for a user of it; raw HTTPS requests for
 * asserting the wire itself.
 */
import fs from 'node:fs/promises';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { ExecutionContext } from 'ava';
import pino from 'pino';
import { KubeApi, type KubeApiOptions } from '../../../src/kube/kube-api.js';
import { loadKubeConfig } from '../../../src/kube/kube-config.js';
import { removeOnExit } from '../../../kit/launch/exit-cleanup.js';
import { KubeApiStandIn, type KubeApiStandInOptions, type KubeconfigUser } from './kube-api-stand-in.js';
import { Rbac } from './rbac.js';

export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../..');

export interface KubeFixture {
  api: KubeApiStandIn;
  dir: string;
  /** A Kanal client of the stand-in as `user`. */
  client(user: KubeconfigUser, options?: Omit<KubeApiOptions, 'kubeConfig'>): Promise<KubeApi>;
  /** A raw request with a fresh static bearer token for `user` (default: an admin). */
  request(method: string, urlPath: string, options?: RawRequestOptions): Promise<RawResponse>;
}

export interface RawRequestOptions {
  body?: unknown;
  headers?: Record<string, string>;
  user?: string;
  groups?: string[];
  /** Without any credential (anonymous). */
  anonymous?: boolean;
}

export interface RawResponse {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  text: string;
  json(): Record<string, unknown>;
}

export async function startKubeApi(t: ExecutionContext, options: Omit<KubeApiStandInOptions, 'dir'> = {}): Promise<KubeFixture> {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'kanal-kube-'));
  removeOnExit.add(dir);
  const api = await KubeApiStandIn.start({ dir, ...options });
  const clients: KubeApi[] = [];
  t.teardown(async () => {
    for (const client of clients) client.close();
    await api.close();
    await fs.rm(dir, { recursive: true, force: true });
    removeOnExit.delete(dir);
  });
  let n = 0;
  const ca = await fs.readFile(api.caFile);
  return {
    api,
    dir,
    async client(user, clientOptions = {}) {
      const file = await api.writeKubeconfig(path.join(dir, `kubeconfig-${++n}`), user);
      const client = new KubeApi({ kubeConfig: loadKubeConfig({ kubeconfig: file }), ...clientOptions });
      clients.push(client);
      return client;
    },
    request(method, urlPath, o = {}) {
      const headers: Record<string, string> = { Accept: 'application/json', ...o.headers };
      if (!o.anonymous) {
        const token = `raw-${++n}-${Math.random().toString(36).slice(2)}`;
        api.tokens.registerStaticToken(token, { username: o.user ?? 'kubernetes-admin', groups: o.groups ?? ['system:masters'] });
        headers.Authorization = `Bearer ${token}`;
      }
      const body = o.body === undefined ? undefined : typeof o.body === 'string' ? o.body : JSON.stringify(o.body);
      if (body !== undefined) {
        headers['Content-Type'] ??= 'application/json';
        headers['Content-Length'] = String(Buffer.byteLength(body)); // DELETE has no chunked default
      }
      return new Promise<RawResponse>((resolve, reject) => {
        const req = https.request(`${api.url}${urlPath}`, { method, headers, ca, timeout: 10_000 }, (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () => {
            const text = Buffer.concat(chunks).toString('utf8');
            resolve({ status: res.statusCode ?? 0, headers: res.headers, text, json: () => JSON.parse(text) as Record<string, unknown> });
          });
          res.on('error', reject);
        });
        req.on('timeout', () => req.destroy(new Error(`${method} ${urlPath}: no answer in 10 s`)));
        req.on('error', reject);
        req.end(body);
      });
    },
  };
}

/** The RBAC Kanal ships, as the stand-in's authorizer. */
export async function shippedRbac(): Promise<Rbac> {
  const files = ['konnectivity-server.yaml', 'konnectivity-agent.yaml'].map((f) => path.join(REPO, 'deploy', 'rbac', f));
  return Rbac.fromYaml(...(await Promise.all(files.map((f) => fs.readFile(f, 'utf8')))));
}

/**
 * The stand-in as Kanal's Kubernetes deployments see it: the shipped RBAC,
 * bookmarks every second, and kubeconfigs in `dir` for the server's user
 * (`system:konnectivity-server`, a client certificate, as the setup guide)
 * and the agents' service account (`kube-system/konnectivity-agent`, a token file).
 */
export async function startKonnectivityKubeApi(
  t: ExecutionContext,
  dir: string,
): Promise<{ k: KubeFixture; serverKubeconfig: string; agentKubeconfig: string }> {
  const k = await startKubeApi(t, { rbac: await shippedRbac(), bookmarkIntervalMs: 1000 });
  const serverKubeconfig = await k.api.writeKubeconfig(path.join(dir, 'server.kubeconfig'), {
    user: 'system:konnectivity-server',
    auth: 'certificate',
  });
  const agentKubeconfig = await k.api.writeKubeconfig(path.join(dir, 'agent.kubeconfig'), {
    user: 'system:serviceaccount:kube-system:konnectivity-agent',
    groups: ['system:serviceaccounts', 'system:serviceaccounts:kube-system'],
    auth: 'token-file',
  });
  return { k, serverKubeconfig, agentKubeconfig };
}

/** A logger that keeps its lines for assertions. */
export function memoryLogger(): { log: pino.Logger; lines: Array<{ level: number; msg: string } & Record<string, unknown>> } {
  const lines: Array<{ level: number; msg: string } & Record<string, unknown>> = [];
  const log = pino({ level: 'debug' }, { write: (s: string) => void lines.push(JSON.parse(s) as { level: number; msg: string }) });
  return { log, lines };
}

export async function waitUntil(cond: () => boolean, what: string, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}
