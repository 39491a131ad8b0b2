/**
 * The Kubernetes API flags `kanal server` and `kanal agent` share with
 * upstream v0.36 (#14): where the client finds the API, how fast it may ask,
 * and where the server-count Leases live. Checked here, used by
 * src/kube/kube-clients.ts and the lease controller and counter.
 */
import type { KubeClientConfig } from '../kube/kube-clients.js';
import { JSON_CONTENT_TYPE, PROTOBUF_CONTENT_TYPE } from '../kube/content-types.js';
import { DEFAULT_LEASE_NAMESPACE } from '../kube/lease.js';
import { LabelSelector, parseLabels, type Labels } from '../kube/labels.js';
import { UsageError } from './usage-error.js';

export const kubeconfigOption = {
  type: 'string',
  describe: 'kubeconfig for the Kubernetes API (token reviews, leases); absent: the in-cluster configuration of the pod',
} as const;

export const kubeApiContentTypeOption = {
  type: 'string',
  default: PROTOBUF_CONTENT_TYPE,
  describe: `Content type of requests to the Kubernetes API: ${PROTOBUF_CONTENT_TYPE} (upstream's default) or ${JSON_CONTENT_TYPE}; Kanal's client sends JSON for both`,
} as const;

export const leaseNamespaceOption = { type: 'string', default: DEFAULT_LEASE_NAMESPACE, describe: 'Namespace of the server-count Leases' } as const;

export function kubeClientConfig(a: { kubeconfig?: string | undefined; 'kube-api-content-type': string; 'kubeconfig-qps'?: number; 'kubeconfig-burst'?: number }): KubeClientConfig {
  const contentType = a['kube-api-content-type'];
  if (contentType !== PROTOBUF_CONTENT_TYPE && contentType !== JSON_CONTENT_TYPE) {
    throw new UsageError(`--kube-api-content-type ${JSON.stringify(contentType)}: use ${PROTOBUF_CONTENT_TYPE} or ${JSON_CONTENT_TYPE}`);
  }
  const qps = a['kubeconfig-qps'] ?? 0;
  const burst = a['kubeconfig-burst'] ?? 0;
  if (!Number.isFinite(qps)) throw new UsageError('--kubeconfig-qps must be a number (0: client-go\'s 5; negative: no limit)');
  if (!Number.isInteger(burst) || burst < 0) throw new UsageError(`--kubeconfig-burst must be a whole number of at least 0 (0: client-go's 10), got ${burst}`);
  return { kubeconfig: a.kubeconfig || undefined, qps, burst, contentType };
}

/** The server's `--lease-label`: exactly these labels on its Lease. */
export function leaseLabelsFlag(value: string): Labels {
  try {
    return parseLabels(value, '--lease-label');
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
}

/** The agent's `--lease-label`: a label selector. */
export function leaseSelectorFlag(value: string): string {
  try {
    LabelSelector.parse(value, '--lease-label');
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
  return value;
}
