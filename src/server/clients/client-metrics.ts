/**
 * Per frontend client (docs/metrics.md, "Frontend clients"):
 * kanal_frontend_client_dials_total{client,result} and
 * kanal_frontend_client_connections{client}, on the tenant's registry. The
 * `client` label is a `clients:` entry's name: the list bounds it.
 */
import { Counter, Gauge, type Registry } from '../../domain/prom-client.js';
import type { DialResult } from '../../domain/dial-result.js';
import type { LabelledCounter } from '../../domain/metrics.js';

export class ClientMetrics {
  readonly dials: LabelledCounter<{ client: string; result: DialResult }>;
  /** Connections open by client name; no zero entries. */
  private readonly open = new Map<string, number>();

  constructor(registry: Registry) {
    this.dials = new Counter({
      name: 'kanal_frontend_client_dials_total',
      help: 'Dials a frontend client (a clients: entry) asked for, by result (forbidden: no rule of its entry allows the destination)',
      labelNames: ['client', 'result'],
      registers: [registry],
    });
    const open = this.open;
    new Gauge({
      name: 'kanal_frontend_client_connections',
      help: 'Connections a frontend client (a clients: entry) holds open',
      labelNames: ['client'],
      registers: [registry],
      collect() {
        this.reset();
        for (const [client, n] of open) this.set({ client }, n);
      },
    });
  }

  dialed(client: string, result: DialResult): void {
    this.dials.inc({ client, result });
  }

  /** One more connection of `client`; the function returned counts it closed (once). */
  opened(client: string): () => void {
    this.open.set(client, (this.open.get(client) ?? 0) + 1);
    let closed = false;
    return () => {
      if (closed) return;
      closed = true;
      const left = (this.open.get(client) ?? 1) - 1;
      if (left > 0) this.open.set(client, left);
      else this.open.delete(client);
    };
  }
}
