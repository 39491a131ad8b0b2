/**
 * The Kubernetes API settings `kanal server` and `kanal agent` share with
 * upstream v0.36: where the client finds the API, how fast it may ask, and
 * where the server-count Leases live (docs/kubernetes-api.md).
 */
import type { KubeClientConfig } from './kube-clients.js';
import { JSON_CONTENT_TYPE, PROTOBUF_CONTENT_TYPE } from './content-types.js';
import { LabelSelector, parseLabels, type Labels } from './labels.js';
import { DEFAULT_LEASE_LABEL, DEFAULT_LEASE_NAMESPACE } from './lease.js';
import { UsageError } from '../common/usage-error.js';
import { errorMessage } from '../common/error-message.js';
import { optionalText, setting, text } from '../settings/kinds.js';

export const KUBE = 'Kubernetes API';
export const LEASES = 'Server count (HA)';

const CONTENT_TYPES = [PROTOBUF_CONTENT_TYPE, JSON_CONTENT_TYPE] as const;

/** What both commands take to reach the API. */
export const kubeSettings = {
  kubeconfig: optionalText({
    describe: 'kubeconfig for the Kubernetes API (token reviews, leases); absent: the in-cluster configuration of the pod',
    group: KUBE,
  }),
  'kube-api-content-type': text({
    default: PROTOBUF_CONTENT_TYPE,
    describe: `Content type of requests to the Kubernetes API: ${PROTOBUF_CONTENT_TYPE} (upstream's default) or ${JSON_CONTENT_TYPE}; Kanal's client sends JSON for both`,
    group: KUBE,
    check: (v, flag) => {
      if (!CONTENT_TYPES.some((c) => c === v)) throw new UsageError(`--${flag} ${JSON.stringify(v)}: use ${CONTENT_TYPES.join(' or ')}`);
    },
  }),
  'lease-namespace': text({ default: DEFAULT_LEASE_NAMESPACE, describe: 'Namespace of the server-count Leases', group: LEASES }),
} as const;

/** The server's request rate to the API (client-go's names). */
export const kubeRateSettings = {
  'kubeconfig-qps': setting({
    type: 'number',
    default: 0,
    describe: "Requests per second to the Kubernetes API, per client (0: client-go's 5; negative: no limit)",
    group: KUBE,
    parse: (v: number, flag) => {
      if (!Number.isFinite(v)) throw new UsageError(`--${flag} must be a number (0: client-go's 5; negative: no limit)`);
      return v;
    },
  }),
  'kubeconfig-burst': setting({
    type: 'number',
    default: 0,
    describe: "Burst of requests to the Kubernetes API, per client (0: client-go's 10)",
    group: KUBE,
    parse: (v: number, flag) => {
      if (!Number.isInteger(v) || v < 0)
        throw new UsageError(`--${flag} must be a whole number of at least 0 (0: client-go's 10), got ${v}`);
      return v;
    },
  }),
} as const;

/** The server's `--lease-label`: exactly these labels on its Lease. */
export const leaseLabelsSetting = setting({
  type: 'string',
  default: DEFAULT_LEASE_LABEL,
  describe: 'Labels of the server Leases (k=v,k2=v2)',
  group: LEASES,
  parse: (v: string, flag): Labels => {
    try {
      return parseLabels(v, `--${flag}`);
    } catch (err) {
      throw new UsageError(errorMessage(err));
    }
  },
});

/** The agent's `--lease-label`: a label selector. */
export const leaseSelectorSetting = setting({
  type: 'string',
  default: DEFAULT_LEASE_LABEL,
  describe: 'Label selector of the server Leases counted',
  group: LEASES,
  parse: (v: string, flag): string => {
    try {
      LabelSelector.parse(v, `--${flag}`);
    } catch (err) {
      throw new UsageError(errorMessage(err));
    }
    return v;
  },
});

/** The client's configuration from the settings above (the rate settings are the server's; the agent asks at client-go's defaults). */
export function kubeClientConfig(v: {
  kubeconfig: string | undefined;
  'kube-api-content-type': string;
  'kubeconfig-qps'?: number;
  'kubeconfig-burst'?: number;
}): KubeClientConfig {
  return {
    kubeconfig: v.kubeconfig || undefined,
    qps: v['kubeconfig-qps'] ?? 0,
    burst: v['kubeconfig-burst'] ?? 0,
    contentType: v['kube-api-content-type'],
  };
}
