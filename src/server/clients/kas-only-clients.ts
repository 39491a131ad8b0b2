/**
 * The frontend clients of a tenant without a `clients:` section: every
 * client is its kube-apiserver, which may reach everything, as upstream.
 */
import type { CancelSignal } from '../../common/cancel.js';
import type { AgentDialer, ClientCredentials, Dialed, FrontendClient, FrontendClients } from './frontend-client.js';

export const KAS_CLIENT_NAME = 'kube-apiserver';

export class KasOnlyClients implements FrontendClients {
  constructor(private readonly dialer: AgentDialer) {}

  admit({ identity }: ClientCredentials): Promise<FrontendClient> {
    return Promise.resolve({ name: KAS_CLIENT_NAME, identity });
  }

  async dial(client: FrontendClient, address: string, signal?: CancelSignal): Promise<Dialed> {
    return { via: 'tunnel', conn: await this.dialer.dial(address, signal, client.identity) };
  }
}
