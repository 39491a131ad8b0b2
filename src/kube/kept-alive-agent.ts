/** How KubeApi's calls reach the API: over kept-alive connections, each call bound to its deadline's abort signal. */
import { createHash } from 'node:crypto';
import type http from 'node:http';
import https from 'node:https';
import {
  IsomorphicFetchHttpLibrary,
  type HttpLibrary,
  type Observable,
  type RequestContext,
  type ResponseContext,
} from '@kubernetes/client-node';

/**
 * client-node's fetch library, with every request bound to one abort signal
 * (the call's deadline) and sent over the client's kept-alive connections.
 */
export class AbortableHttpLibrary implements HttpLibrary {
  private readonly inner = new IsomorphicFetchHttpLibrary();
  constructor(
    private readonly signal: AbortSignal,
    private readonly agents: KeptAliveAgent,
  ) {}

  send(request: RequestContext): Observable<ResponseContext> {
    request.setSignal(this.signal);
    const agent = this.agents.for(request.getAgent());
    if (agent) request.setAgent(agent);
    return this.inner.send(request);
  }
}

/**
 * client-node builds a new https.Agent for every request, so every call paid
 * a TLS handshake. This keeps one kept-alive agent per set of TLS options
 * (client-node re-reads the credential files per request, so a rotated
 * certificate yields new options and a new agent; the old one's idle sockets
 * time out). Proxy agents are left as they are.
 */
export class KeptAliveAgent {
  private current: { key: string; agent: https.Agent } | undefined;

  constructor(private readonly maxSockets: number) {}

  for(fresh: http.Agent | https.Agent | undefined): https.Agent | undefined {
    if (!fresh || Object.getPrototypeOf(fresh) !== https.Agent.prototype) return undefined;
    const o = (fresh as https.Agent).options;
    const key = createHash('sha256')
      .update(
        JSON.stringify(
          [o.ca, o.cert, o.key, o.pfx, o.passphrase, o.rejectUnauthorized, o.servername].map((v) =>
            Buffer.isBuffer(v) ? v.toString('base64') : v,
          ),
        ),
      )
      .digest('hex');
    if (this.current?.key !== key) {
      this.current = {
        key,
        agent: new https.Agent({ ...o, keepAlive: true, maxSockets: this.maxSockets, maxFreeSockets: this.maxSockets, timeout: 60_000 }),
      };
    }
    return this.current.agent;
  }

  close(): void {
    this.current?.agent.destroy();
    this.current = undefined;
  }
}
