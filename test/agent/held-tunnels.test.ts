/**
 * The tunnels an agent holds (src/agent/held-tunnels.ts), up and detached, on
 * stand-in tunnels that emit what a Tunnel emits: a lost stream moves a tunnel
 * from up to detached and tells the listeners, a resume moves it back, a close
 * drops it from both; a server that answers without resuming, or an address
 * that refuses, closes the detached tunnel now; and the sums read the tunnels up.
 */
import test from 'ava';
import { EventEmitter } from 'node:events';
import { HeldTunnels } from '../../src/agent/held-tunnels.js';
import type { ServerConnection } from '../../src/agent/server-connection.js';
import type { Tunnel } from '../../src/tunnel/tunnel.js';
import { KanalMetrics } from '../../src/domain/metrics.js';
import { captureLogger, type CapturedLogger } from '../helpers/in-process.js';

/** What HeldTunnels reads of a Tunnel; close() emits 'close' as a Tunnel does. */
class StandInTunnel extends EventEmitter {
  closedWith: Error | undefined;
  connections = 2;
  stats(): { connections: number; pendingDials: number; inboundDials: number; windowGrowthBytes: number } {
    return { connections: this.connections, pendingDials: 1, inboundDials: 0, windowGrowthBytes: 10 };
  }
  retainedBytes(): number {
    return 100;
  }
  close(err?: Error): void {
    this.closedWith = err;
    this.emit('close', err);
  }
}

function connection(serverID: string, tunnel: StandInTunnel, more: Partial<ServerConnection> = {}): ServerConnection {
  return {
    serverID,
    serverCount: 1,
    tunnel: tunnel as unknown as Tunnel,
    resumeToken: `token-${serverID}`,
    resumed: false,
    notResumed: [],
    refusedTargets: [],
    ...more,
  } as ServerConnection;
}

interface Watched {
  held: HeldTunnels;
  logs: CapturedLogger;
  events: string[];
  metrics: KanalMetrics;
}

function watched(running = true): Watched {
  const logs = captureLogger('debug');
  const events: string[] = [];
  const metrics = new KanalMetrics('agent');
  const held = new HeldTunnels({
    metrics,
    log: logs.log,
    resumeTimeoutMs: 60_000,
    running: () => running,
    serverFailure: () => events.push('failure'),
    down: () => events.push('down'),
    changed: () => events.push('changed'),
  });
  return { held, logs, events, metrics };
}

test('a lost stream moves the tunnel to detached; a resume brings it back up; a close drops it', (t) => {
  const { held, logs, events } = watched();
  const tunnel = new StandInTunnel();
  const conn = connection('s1', tunnel);
  held.hold(conn, 'a:1');
  t.true(held.holds('s1'));
  t.true(held.through('a:1'));
  t.false(held.through('b:1'));
  tunnel.emit('detached', new Error('stream reset'));
  t.false(held.holds('s1'));
  t.is(held.detached.get('s1')?.address, 'a:1');
  t.deepEqual([...held.resumable()], [['token-s1', tunnel]]);
  t.deepEqual(events, ['failure', 'down', 'changed']);
  t.like(logs.matching('tunnel lost; its connections wait for it to resume')[0], {
    serverID: 's1',
    reason: 'stream reset',
    connections: 2,
  });

  // The same tunnel on a new stream: held up again, no second watch.
  held.hold({ ...conn, resumed: true }, 'a:1');
  t.true(held.holds('s1'));
  t.is(held.detached.size, 0);
  t.is(tunnel.listenerCount('close'), 1, 'followed once');

  tunnel.close(new Error('server gone'));
  t.false(held.holds('s1'));
  t.deepEqual(events, ['failure', 'down', 'changed', 'changed', 'failure', 'down']);
  t.is(logs.matching('tunnel down')[0].level, 40, 'an unplanned loss is a warning');
});

test('while stopping a loss is planned: logged at info, no server failure counted', (t) => {
  const { held, logs, events } = watched(false);
  const tunnel = new StandInTunnel();
  held.hold(connection('s1', tunnel), 'a:1');
  tunnel.close(new Error('closed by stop'));
  t.deepEqual(events, ['changed', 'down']);
  t.is(logs.matching('tunnel down')[0].level, 30);
});

test('a detached tunnel that closes leaves the table without telling the listeners again', (t) => {
  const { held, logs, events } = watched();
  const tunnel = new StandInTunnel();
  held.hold(connection('s1', tunnel), 'a:1');
  tunnel.emit('detached', new Error('lost'));
  tunnel.emit('resume-expired');
  tunnel.close(new Error('resume timeout'));
  t.is(held.detached.size, 0);
  t.deepEqual(events, ['failure', 'down', 'changed', 'changed']);
  t.is(logs.matching('tunnel not resumed in time').length, 1);
  t.like(logs.matching('tunnel down')[0], { address: 'a:1', reason: 'resume timeout' });
});

test('a server that answers with a new tunnel no longer holds the detached one: closed now, counted as refused', async (t) => {
  const { held, logs, metrics } = watched();
  const old = new StandInTunnel();
  held.hold(connection('s1', old), 'a:1');
  old.emit('detached', new Error('lost'));
  // Its own tunnel resumed is no news.
  held.forgottenBy(connection('s1', old));
  t.is(old.closedWith, undefined);
  held.forgottenBy(connection('s2', new StandInTunnel()));
  t.is(old.closedWith, undefined, 'another server says nothing of it');
  held.forgottenBy(connection('s1', new StandInTunnel()));
  t.is(old.closedWith?.message, 'server s1 no longer holds the tunnel (restarted?)');
  t.is(held.detached.size, 0);
  t.is(logs.matching('server no longer holds the tunnel').length, 1);
  t.regex(await metrics.registry.metrics(), /kanal_resumes_total\{result="refused"\} 1/);
});

test('an address that refuses closes the tunnels detached through it, and only those', (t) => {
  const { held } = watched();
  const [a, b] = [new StandInTunnel(), new StandInTunnel()];
  held.hold(connection('s1', a), 'a:1');
  held.hold(connection('s2', b), 'b:1');
  a.emit('detached', new Error('lost'));
  b.emit('detached', new Error('lost'));
  held.refusedThrough('a:1');
  t.is(a.closedWith?.message, 'server s1 at a:1 refuses connections');
  t.is(b.closedWith, undefined);
  t.deepEqual([...held.detached.keys()], ['s2']);
});

test('the sums read the tunnels up (in flight: connections and dials); retained bytes count the detached too', async (t) => {
  const { held, metrics } = watched();
  const [a, b] = [new StandInTunnel(), new StandInTunnel()];
  held.hold(connection('s1', a), 'a:1');
  held.hold(connection('s2', b), 'b:1');
  b.emit('detached', new Error('lost'));
  t.is(held.openConnections(), 2);
  t.is(held.inFlight(), 3);
  t.is(held.windowGrowthBytes(), 10);
  const text = await metrics.registry.metrics();
  t.regex(text, /kanal_resume_retained_bytes 200/);
  t.regex(text, /kanal_resume_detached_tunnels 1/);
  t.regex(text, /kanal_resume_detached_connections 2/);
});
