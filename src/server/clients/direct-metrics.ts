/**
 * Dials on direct routes (docs/metrics.md, "Direct routes"), on the tenant's
 * registry: kanal_direct_route_dials_total{result},
 * kanal_direct_route_connections and kanal_direct_route_bytes_total{flow}.
 * Registered with the first route, so a tenant without any has no series.
 */
import { Counter, Gauge, type Registry } from '../../domain/prom-client.js';
import type { DialResult } from '../../domain/dial-result.js';
import type { LabelledCounter } from '../../domain/metrics.js';

export class DirectMetrics {
  private readonly dials: LabelledCounter<{ result: DialResult }>;
  private readonly bytes: LabelledCounter<{ flow: 'to_destination' | 'to_client' }>;
  /** Connections open now: >= 0, one per dial that succeeded and has not closed. */
  private open = 0;

  constructor(registry: Registry) {
    this.dials = new Counter({
      name: 'kanal_direct_route_dials_total',
      help: 'Dials the server made itself on a direct route, by result (the values of kanal_dials_total)',
      labelNames: ['result'],
      registers: [registry],
    });
    this.bytes = new Counter({
      name: 'kanal_direct_route_bytes_total',
      help: 'Bytes carried on direct-route connections that ended, by flow (to_destination: what clients sent)',
      labelNames: ['flow'],
      registers: [registry],
    });
    const open = (): number => this.open;
    new Gauge({
      name: 'kanal_direct_route_connections',
      help: 'Connections on direct routes open now',
      registers: [registry],
      collect() {
        this.set(open());
      },
    });
  }

  dialed(result: DialResult): void {
    this.dials.inc({ result });
    if (result === 'ok') this.open++;
  }

  closed(toDestination: number, toClient: number): void {
    this.open--;
    this.bytes.inc({ flow: 'to_destination' }, toDestination);
    this.bytes.inc({ flow: 'to_client' }, toClient);
  }
}
