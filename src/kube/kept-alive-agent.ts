/** How KubeApi's calls reach the API: over kept-alive connections, each call bound to its deadline's abort signal. */
import { createHash } from 'node:crypto';
import type https from 'node:https';
import {
  IsomorphicFetchHttpLibrary,
  type HttpLibrary,
  type KubeConfig,
  type Observable,
  type RequestContext,
  type ResponseContext,
  type SecurityAuthentication,
  type DispatcherOptions,
} from '@kubernetes/client-node';
import { Agent } from 'undici';

type AgentConnectOptions = Extract<DispatcherOptions, { type: 'agent' }>['connect'];

/** client-node's fetch library, with every request bound to one abort signal (the call's deadline). */
export class AbortableHttpLibrary implements HttpLibrary {
  private readonly inner = new IsomorphicFetchHttpLibrary();
  constructor(private readonly signal: AbortSignal) {}

  send(request: RequestContext): Observable<ResponseContext> {
    request.setSignal(this.signal);
    return this.inner.send(request);
  }
}

/**
 * client-node builds a new undici Agent (dispatcher) for every request
 * (KubeConfig.applySecurityAuthentication), so every call paid a TLS
 * handshake. This authentication applies the kubeconfig's as client-node
 * does, then sends the request over one kept-alive Agent per set of TLS
 * options: client-node re-reads the credential files per request, so a
 * rotated certificate yields new options and a new Agent, and the old one is
 * closed once its calls end. Proxied clusters keep client-node's dispatcher.
 */
export class KeptAliveAgent implements SecurityAuthentication {
  private current: { key: string; agent: Agent } | undefined;

  constructor(
    private readonly kubeConfig: KubeConfig,
    private readonly maxSockets: number,
  ) {}

  getName(): string {
    return 'kanal-kept-alive';
  }

  async applySecurityAuthentication(context: RequestContext): Promise<void> {
    await this.kubeConfig.applySecurityAuthentication(context);
    const tls: https.RequestOptions = {};
    await this.kubeConfig.applyToHTTPSOptions(tls);
    const { ca, cert, key, pfx, passphrase, rejectUnauthorized, servername } = tls;
    const options = this.kubeConfig.createDispatcherOptions(this.kubeConfig.getCurrentCluster(), {
      ca,
      cert,
      key,
      pfx,
      passphrase,
      rejectUnauthorized,
      servername,
    });
    if (options.type !== 'agent') return;
    context.setDispatcher(this.agentFor(options.connect));
  }

  close(): void {
    void this.current?.agent.destroy();
    this.current = undefined;
  }

  private agentFor(connect: AgentConnectOptions): Agent {
    // JSON.stringify turns each Buffer (ca, cert, key) into its bytes.
    const key = createHash('sha256').update(JSON.stringify(connect)).digest('hex');
    if (this.current?.key !== key) {
      void this.current?.agent.close();
      this.current = { key, agent: new Agent({ connect, connections: this.maxSockets, keepAliveTimeout: 60_000 }) };
    }
    return this.current.agent;
  }
}
