/**
 * A TCP pass-through on 127.0.0.1 for section 8 (suite-reconnect.ts): with one
 * target it is the controllable relay between agents and a server (cut: every
 * pair reset; restore: accept again), with several a round-robin balancer in
 * front of HA servers (test/helpers/round-robin.ts's behaviour: no health
 * checks, a dead target refuses the connection it is given).
 */
import net from 'node:net';

export interface RelayStats {
  /** Connections accepted since the relay started (while cut too: those are reset at once). */
  accepted: number;
  /** Pairs open now. */
  open: number;
  /** Connections reset on arrival because the relay was cut. */
  refusedWhileCut: number;
  /** Pairs whose target refused or failed to connect. */
  targetFailures: number;
}

export class Relay {
  private readonly server: net.Server;
  private readonly pairs = new Set<[net.Socket, net.Socket]>();
  private next = 0;
  private cutNow = false;
  private readonly stats = { accepted: 0, refusedWhileCut: 0, targetFailures: 0 };

  /** `targets`: ports on 127.0.0.1, taken in turn for each accepted connection. */
  constructor(private readonly targets: readonly number[]) {
    if (targets.length === 0) throw new Error('a relay needs at least one target port');
    this.server = net.createServer({ noDelay: true }, (client) => this.accept(client));
  }

  listen(): Promise<number> {
    return new Promise<number>((resolve, reject) => {
      this.server.once('error', reject);
      this.server.listen({ port: 0, host: '127.0.0.1', backlog: 1024 }, () => resolve((this.server.address() as net.AddressInfo).port));
    });
  }

  private accept(client: net.Socket): void {
    this.stats.accepted++;
    client.on('error', () => undefined);
    if (this.cutNow) {
      // A cut link answers nothing but RST, so a reconnecting peer fails at once rather than hanging.
      this.stats.refusedWhileCut++;
      client.resetAndDestroy();
      return;
    }
    const port = this.targets[this.next++ % this.targets.length];
    const target = net.connect({ host: '127.0.0.1', port, noDelay: true });
    const pair: [net.Socket, net.Socket] = [client, target];
    this.pairs.add(pair);
    let connected = false;
    target.once('connect', () => (connected = true));
    const end = (): void => {
      if (!this.pairs.delete(pair)) return;
      if (!connected) this.stats.targetFailures++;
      client.destroy();
      target.destroy();
    };
    target.on('error', end);
    client.on('error', end);
    client.once('close', end);
    target.once('close', end);
    client.pipe(target);
    target.pipe(client);
  }

  /** Resets every pair (both sides see ECONNRESET) and resets every connection until restore(); returns the pairs reset. */
  cut(): number {
    this.cutNow = true;
    const pairs = [...this.pairs];
    this.pairs.clear();
    for (const [a, b] of pairs) {
      a.resetAndDestroy();
      b.resetAndDestroy();
    }
    return pairs.length;
  }

  restore(): void {
    this.cutNow = false;
  }

  counts(): RelayStats {
    return { ...this.stats, open: this.pairs.size };
  }

  close(): Promise<void> {
    for (const [a, b] of this.pairs) {
      a.destroy();
      b.destroy();
    }
    this.pairs.clear();
    return new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}
