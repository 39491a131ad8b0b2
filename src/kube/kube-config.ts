/**
 * Where Kanal's Kubernetes client finds its API server and credentials:
 * `--kubeconfig` as given, or, without it, the in-cluster configuration a pod
 * gets (KUBERNETES_SERVICE_HOST/PORT and the mounted service account), as
 * upstream's clientcmd.BuildConfigFromFlags("", path) does. Every failure
 * names the flag or file to fix.
 */
import fs from 'node:fs';
import path from 'node:path';
import { KubeConfig, type User } from '@kubernetes/client-node';
import { parse as parseYaml } from 'yaml';
import { errorMessage } from '../common/error-message.js';
import { formatHostPort } from '../common/host-port.js';

export const SERVICE_ACCOUNT_DIR = '/var/run/secrets/kubernetes.io/serviceaccount';

export class KubeConfigError extends Error {
  override readonly name = 'KubeConfigError';
}

export interface KubeConfigSource {
  /** `--kubeconfig`; absent or empty: in-cluster configuration. */
  kubeconfig?: string | undefined;
  /** Environment for the in-cluster configuration (default process.env). */
  env?: NodeJS.ProcessEnv;
  /** Mounted service account for the in-cluster configuration (default {@link SERVICE_ACCOUNT_DIR}). */
  serviceAccountDir?: string;
}

export function loadKubeConfig(source: KubeConfigSource = {}): KubeConfig {
  const kc = source.kubeconfig
    ? fromFile(source.kubeconfig)
    : inCluster(source.env ?? process.env, source.serviceAccountDir ?? SERVICE_ACCOUNT_DIR);
  const where = source.kubeconfig ? `kubeconfig ${source.kubeconfig}` : 'the in-cluster configuration';
  const cluster = kc.getCurrentCluster();
  if (!cluster) throw new KubeConfigError(`${where}: no cluster for current-context ${JSON.stringify(kc.getCurrentContext())}`);
  const user = kc.getCurrentUser();
  if (!user) throw new KubeConfigError(`${where}: no user for current-context ${JSON.stringify(kc.getCurrentContext())}`);
  if (!hasCredential(user)) {
    // Anonymous requests would only come back 401/403 later, further from the cause.
    throw new KubeConfigError(
      `${where}: user ${JSON.stringify(user.name)} has no credential (client-certificate, token, tokenFile, exec or auth-provider)`,
    );
  }
  let url: URL;
  try {
    url = new URL(cluster.server);
  } catch {
    throw new KubeConfigError(`${where}: cluster server ${JSON.stringify(cluster.server)} is not a URL`);
  }
  if (url.protocol !== 'https:') {
    throw new KubeConfigError(
      `${where}: cluster server ${cluster.server} is not https://; Kanal talks to the Kubernetes API over TLS only`,
    );
  }
  return kc;
}

function fromFile(file: string): KubeConfig {
  const kc = new KubeConfig();
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
    kc.loadFromString(text);
    kc.makePathsAbsolute(path.dirname(file));
  } catch (err) {
    throw new KubeConfigError(`--kubeconfig ${file}: ${errorMessage(err)}`);
  }
  useTokenFile(kc, text, path.dirname(file));
  return kc;
}

/**
 * client-go's `tokenFile` user field (client-node reads only its own
 * `token-file`, once): mapped to client-node's file authenticator, which
 * re-reads the file every minute as client-go does, so rotated tokens are used.
 */
function useTokenFile(kc: KubeConfig, text: string, dir: string): void {
  const user = kc.getCurrentUser();
  if (!user || user.token) return;
  const doc = parseYaml(text) as { users?: Array<{ name?: string; user?: { tokenFile?: unknown } }> } | null;
  const tokenFile = doc?.users?.find((u) => u.name === user.name)?.user?.tokenFile;
  if (typeof tokenFile !== 'string' || tokenFile === '') return;
  const users = kc
    .getUsers()
    .map((u) =>
      u.name === user.name ? { ...u, authProvider: { name: 'tokenFile', config: { tokenFile: path.resolve(dir, tokenFile) } } } : u,
    );
  kc.loadFromOptions({ clusters: kc.getClusters(), users, contexts: kc.getContexts(), currentContext: kc.getCurrentContext() });
}

function hasCredential(user: User): boolean {
  return Boolean(user.token || user.certFile || user.certData || user.exec || user.authProvider || user.username);
}

function inCluster(env: NodeJS.ProcessEnv, dir: string): KubeConfig {
  const host = env.KUBERNETES_SERVICE_HOST;
  const port = env.KUBERNETES_SERVICE_PORT;
  if (!host || !port) {
    throw new KubeConfigError(
      'no --kubeconfig given and not running in a pod (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are unset): pass --kubeconfig',
    );
  }
  const tokenFile = path.join(dir, 'token');
  const caFile = path.join(dir, 'ca.crt');
  for (const file of [tokenFile, caFile]) {
    try {
      fs.accessSync(file, fs.constants.R_OK);
    } catch {
      throw new KubeConfigError(
        `no --kubeconfig given and the in-cluster service account file ${file} is not readable: mount the service account or pass --kubeconfig`,
      );
    }
  }
  const kc = new KubeConfig();
  kc.loadFromClusterAndUser(
    { name: 'in-cluster', server: `https://${formatHostPort({ host, port: Number(port) })}`, caFile, skipTLSVerify: false },
    // client-node's FileAuth re-reads the file every minute: projected tokens rotate.
    { name: 'in-cluster', authProvider: { name: 'tokenFile', config: { tokenFile } } },
  );
  return kc;
}
