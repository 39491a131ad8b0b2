/**
 * The checks a start makes before it serves, beyond the flags and the
 * credential files: one function per command, run by the start and by
 * `--dry-run` alike, so a dry run refuses what the start would refuse
 * (docs/operations.md, "Start-up errors"). Binding the ports is the one
 * thing a dry run leaves out: it is an act, not a check.
 */
import type { AgentConfig } from '../agent/config.js';
import type { ServerConfig } from '../server/config/config.js';
import { assertRolesSeparated, ClientRoles } from '../server/identity/client-roles.js';
import { createLogger } from '../common/logger.js';
import { kubeClients, type KubeClientConfig } from '../kube/kube-clients.js';
import { checkAuditLogPath } from '../audit/audit-log.js';

/** The kubeconfig read as a start reads it (kube-clients.ts): a KubeConfigError names the file or environment; nothing is connected. */
async function checkKubeconfig(kube: KubeClientConfig | undefined): Promise<void> {
  if (kube) await kubeClients(kube, createLogger('silent', 'start-checks'));
}

/**
 * `kanal server`: the roles kept apart (one cluster: an agent CA that is the
 * kube-apiserver's too needs both roles pinned, client-roles.ts; a server of
 * tenants checks it per tenant as it loads them), the kubeconfig readable,
 * --audit-log-path writable.
 */
export async function serverStartChecks(
  config: ServerConfig,
  /** The client CAs of the agent port and the TCP frontend, as loadServerCredentials read them. */
  credentials: { agent: { ca?: Buffer }; frontend?: { ca?: Buffer } },
): Promise<void> {
  if (!config.tenants) {
    const roles = new ClientRoles(config.agent.clientPins, config.frontend.tcp?.clientPins);
    assertRolesSeparated(credentials.agent.ca, credentials.frontend?.ca, roles);
  }
  await checkKubeconfig(config.kube);
  checkAuditLogPath(config.settings['audit-log-path']);
}

/** `kanal agent`: the kubeconfig of --count-server-leases readable, --audit-log-path writable. */
export async function agentStartChecks(config: AgentConfig): Promise<void> {
  await checkKubeconfig(config.leases?.kube);
  checkAuditLogPath(config.settings['audit-log-path']);
}
