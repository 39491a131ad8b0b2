/**
 * The Kubernetes API flags' values (#14): where the client finds the API, how
 * fast it may ask, and where the server-count Leases live. Used by
 * kube-clients.ts and the lease controller and counter; mistakes are
 * UsageErrors naming the flag.
 */
import type { KubeClientConfig } from './kube-clients.js';
import { JSON_CONTENT_TYPE, PROTOBUF_CONTENT_TYPE } from './content-types.js';
import { LabelSelector, parseLabels, type Labels } from './labels.js';
import { UsageError } from '../common/usage-error.js';

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
