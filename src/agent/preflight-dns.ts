/**
 * `kanal agent --check`, service-names: with a cluster DNS, the cluster's DNS
 * Service answers for the one Service every cluster has
 * (kubernetes.default.svc, Kubernetes DNS spec), asked as the agent asks it
 * when the server resolves a name (name-resolver.ts). Without the flag the
 * system resolver answers, which the node's own boot already needs.
 */
import type { HostPort } from '../common/host-port.js';
import { errorMessage } from '../common/error-message.js';
import type { CheckResult } from './preflight-options.js';
import { NameResolver } from './name-resolver.js';
import { FLAG } from './settings.js';
import { NameNotResolved } from '../tunnel/name-resolution.js';

/** The Service every cluster has, in the default namespace. */
export const PROBE_SERVICE = 'kubernetes.default.svc';

export async function checkClusterDns(clusterDns: HostPort, clusterDomain: string, queryTimeoutMs = 1500): Promise<CheckResult> {
  const names = new NameResolver({ clusterDns, clusterDomain, queryTimeoutMs });
  try {
    const answer = await names.resolve(PROBE_SERVICE);
    return {
      name: 'service-names',
      status: 'pass',
      detail: `${answer.resolver} answered ${PROBE_SERVICE}.${clusterDomain}: ${answer.addresses.join(', ')}`,
    };
  } catch (err) {
    return {
      name: 'service-names',
      status: 'fail',
      detail: `${err instanceof NameNotResolved ? `${err.resolver}: ` : ''}${errorMessage(err)}: names the server asks this agent to resolve in the cluster will fail (check ${FLAG['cluster-dns']} and ${FLAG['cluster-domain']})`,
    };
  }
}
