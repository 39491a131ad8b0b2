/**
 * The frontend clients of a tenant without a `clients:` section: every
 * client is its kube-apiserver, which may reach everything, as upstream;
 * a destination on a direct route is dialled by the server itself.
 */
import type { CancelSignal } from '../../common/cancel.js';
import { parseHostPort } from '../../common/host-port.js';
import type { AgentDialer, ClientCredentials, Dialed, FrontendClient, FrontendClients } from './frontend-client.js';
import type { ClientPolicyOptions } from './client-policy.js';

export const KAS_CLIENT_NAME = 'kube-apiserver';

export class KasOnlyClients implements FrontendClients {
  constructor(
    private readonly dialer: AgentDialer,
    private readonly direct?: ClientPolicyOptions['direct'],
  ) {}

  admit({ identity }: ClientCredentials): Promise<FrontendClient> {
    return Promise.resolve({ name: KAS_CLIENT_NAME, identity });
  }

  async dial(client: FrontendClient, address: string, signal?: CancelSignal): Promise<Dialed> {
    if (this.direct && !this.direct.empty && this.isDirect(address)) {
      return { via: 'direct', socket: await this.direct.dial(address, client.identity, signal) };
    }
    return { via: 'tunnel', conn: await this.dialer.dial(address, signal, client.identity) };
  }

  /** A malformed address is the dialer's to refuse (it counts and logs it). */
  private isDirect(address: string): boolean {
    try {
      const { host, port } = parseHostPort(address);
      return this.direct?.matches(host, port) ?? false;
    } catch {
      return false;
    }
  }
}
