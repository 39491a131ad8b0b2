/** What `kanal agent --check` is given, and what each of its checks reports. */
import type { Logger } from 'pino';
import type { Transport } from '../transport/transport.js';
import type { Target } from './target.js';
import type { HostPort } from '../common/host-port.js';
import type { InterfaceType } from './host-interface-manager.js';

export type CheckStatus = 'pass' | 'fail' | 'warn' | 'skip';

export interface CheckResult {
  name: string;
  status: CheckStatus;
  detail: string;
}

export interface PreflightOptions {
  agentID: string;
  agentIdentifiers: string;
  server: { host: string; port: number; caFile?: string; certFile?: string; keyFile?: string; serverName?: string };
  tokenFile?: string;
  connectTimeoutMs: number;
  dialTimeoutMs: number;
  node?: { bindAddress: string; targets: readonly Target[]; interfaceType: InterfaceType };
  healthPort?: number;
  /** --cluster-dns and --cluster-domain, when the cluster's DNS Service resolves Service names (preflight-dns.ts). */
  names?: { clusterDns: HostPort; clusterDomain: string };
  transport: Transport;
  /** Logger for the tunnel code; --check passes a silent one. */
  log: Logger;
  /** Replaceable for tests; defaults to the real rtnetlink probe. */
  netlink?: () => { ok: boolean; detail: string };
}
