/**
 * Clients of the Kubernetes API for the server (token reviews, leases) and
 * the agent (lease counter). Only types are imported statically: the client
 * library is a large module graph (start-up time, and descriptors under a
 * low open-files limit), loaded only when a client is wanted.
 */
import type { Logger } from 'pino';
import type { KubeApi } from './kube-api.js';

/** Where the Kubernetes API is and how the client may use it. */
export interface KubeClientConfig {
  /** `--kubeconfig`; undefined: in-cluster. */
  kubeconfig: string | undefined;
  qps: number;
  burst: number;
  contentType: string;
}

/**
 * Makes clients of the API: each user (token reviews, leases) gets its own,
 * so lease renewals never queue behind a storm of agent reviews. The
 * kubeconfig is read here, once: a KubeConfigError names the file or
 * environment to fix before anything starts.
 */
export async function kubeClients(config: KubeClientConfig, log: Logger): Promise<() => KubeApi> {
  const [{ loadKubeConfig }, { KubeApi }] = await Promise.all([import('./kube-config.js'), import('./kube-api.js')]);
  const kubeConfig = loadKubeConfig({ kubeconfig: config.kubeconfig });
  let noticed = false;
  return () => {
    const api = new KubeApi({ kubeConfig, qps: config.qps, burst: config.burst, contentType: config.contentType });
    if (api.contentTypeNotice && !noticed) log.info(api.contentTypeNotice);
    noticed = true;
    return api;
  };
}
