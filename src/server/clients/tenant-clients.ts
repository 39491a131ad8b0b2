/**
 * A tenant's FrontendClients as its doors hold them (tenants/tenant.ts):
 * the kube-apiserver alone (KasOnlyClients, as upstream) while the tenant
 * has no `clients:` list, its ClientPolicy once it has one; a reload switches
 * between them in place, so a door's reference stays good.
 */
import type { Registry } from 'prom-client';
import type { CancelSignal } from '../../common/cancel.js';
import type { ClientEntry } from './client-entry.js';
import { KasOnlyClients } from './kas-only-clients.js';
import { ClientMetrics } from './client-metrics.js';
import { ClientPolicy, type ClientPolicyOptions } from './client-policy.js';
import type { TokenReviewer } from './client-admission.js';
import type { AgentDialer, ClientCredentials, Dialed, FrontendClient, FrontendClients } from './frontend-client.js';

export interface TenantClientsOptions extends Omit<ClientPolicyOptions, 'entries' | 'metrics' | 'reviewer'> {
  /** The tenant's registry: the per-client metrics are registered on it with the first list. */
  registry: Registry;
  /** Made when a list first has a service-account entry (it needs the tenant's token review). */
  reviewer?: () => TokenReviewer | undefined;
}

export class TenantClients implements FrontendClients {
  private readonly kasOnly: KasOnlyClients;
  private policy: ClientPolicy | undefined;
  private current: FrontendClients;
  private metrics: ClientMetrics | undefined;
  private reviewer: TokenReviewer | undefined;

  constructor(
    private readonly opts: TenantClientsOptions & { dialer: AgentDialer },
    entries?: readonly ClientEntry[],
  ) {
    this.kasOnly = new KasOnlyClients(opts.dialer, opts.direct);
    this.current = this.kasOnly;
    this.configure(entries);
  }

  /** Whether a `clients:` list applies (the listeners then read each client's identity). */
  get configured(): boolean {
    return this.current !== this.kasOnly;
  }

  /** The tenant's list now (absent or empty: the kube-apiserver alone). */
  configure(entries: readonly ClientEntry[] | undefined): void {
    if (!entries || entries.length === 0) {
      this.current = this.kasOnly;
      return;
    }
    if (entries.some((e) => e.serviceAccount)) this.reviewer ??= this.opts.reviewer?.();
    if (this.policy) this.policy.configure(entries, this.reviewer);
    else {
      this.metrics ??= new ClientMetrics(this.opts.registry);
      const { reviewer: _, registry: __, ...parts } = this.opts;
      this.policy = new ClientPolicy({ ...parts, entries, metrics: this.metrics, ...(this.reviewer ? { reviewer: this.reviewer } : {}) });
    }
    this.current = this.policy;
  }

  /** A tunnelled connection closed: a client's count goes down. */
  connectionClosed(conn: object): void {
    this.policy?.connectionClosed(conn);
  }

  admit(credentials: ClientCredentials, signal?: CancelSignal): Promise<FrontendClient> {
    return this.current.admit(credentials, signal);
  }

  dial(client: FrontendClient, address: string, signal?: CancelSignal): Promise<Dialed> {
    return this.current.dial(client, address, signal);
  }
}
