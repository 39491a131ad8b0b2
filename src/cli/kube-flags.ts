/**
 * The yargs options of the Kubernetes API flags `kanal server` and `kanal
 * agent` share with upstream v0.36 (#14); their values are checked in
 * src/kube/flag-values.ts.
 */
import { JSON_CONTENT_TYPE, PROTOBUF_CONTENT_TYPE } from '../kube/content-types.js';
import { DEFAULT_LEASE_NAMESPACE } from '../kube/lease.js';

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
