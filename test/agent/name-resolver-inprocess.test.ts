/**
 * Names resolved by a real agent for a real server (in process, over mTLS on
 * 127.0.0.1): the server's Tunnel.resolve reaches the agent's NameResolver,
 * which asks the cluster DNS (a UDP stand-in) for Service names and the
 * system resolver for the rest; an agent without the feature is named.
 */
import test from 'ava';
import { DialError } from '../../src/tunnel/errors.js';
import { ALL_FEATURES, Feature } from '../../src/wire/features.js';
import { makeEnv, startAgent, startServer, waitFor } from '../helpers/in-process.js';
import { startDnsStandIn } from '../helpers/dns-stand-in.js';
import { metricValue } from '../helpers/audit-log.js';

async function unresolved(p: Promise<unknown>): Promise<DialError> {
  try {
    await p;
  } catch (err) {
    if (err instanceof DialError) return err;
    throw new Error(`expected DialError, got ${String(err)}`, { cause: err });
  }
  throw new Error('expected a rejection');
}

test('the server resolves names through the agent: Service names by the cluster DNS, others by the system resolver', async (t) => {
  const dns = await startDnsStandIn();
  t.teardown(() => dns.close());
  dns.records.set('web.shop.svc.cluster.local', { kind: 'records', a: ['10.96.7.7'], ttl: 30 });
  const env = await makeEnv(t);
  const { server } = await startServer(t, env);
  const { agent } = await startAgent(t, env, server.agentPort, { extraFlags: ['--cluster-dns', `${dns.host}:${dns.port}`] });
  await waitFor(() => server.registry.size === 1, 'agent connected');
  const tunnel = server.registry.list()[0].tunnel;
  t.true(tunnel.features.has(Feature.Resolve));
  const resolver = `cluster DNS 127.0.0.1:${dns.port}`;
  t.deepEqual(await tunnel.resolve('web.shop.svc', { timeoutMs: 5000 }), { addresses: ['10.96.7.7'], resolver, ttlSeconds: 30 });
  const local = await tunnel.resolve('localhost', { timeoutMs: 5000 });
  t.is(local.resolver, 'system resolver');
  t.true(local.addresses.length > 0);
  const err = await unresolved(tunnel.resolve('gone.shop.svc', { timeoutMs: 5000 }));
  t.is(err.failure, 'unresolved');
  t.is(err.message, `cannot resolve gone.shop.svc: gone.shop.svc.cluster.local: no such name (NXDOMAIN) (resolver: ${resolver})`);
  // The agent counts what it answered.
  t.is(await metricValue(agent.metrics.registry, 'kanal_name_resolutions_total', { result: 'ok' }), 2);
  t.is(await metricValue(agent.metrics.registry, 'kanal_name_resolutions_total', { result: 'unresolved' }), 1);
});

test('an agent that does not offer resolve: names are unresolved, saying the agent does not resolve names', async (t) => {
  const env = await makeEnv(t);
  const { server } = await startServer(t, env);
  const features = new Set([...ALL_FEATURES].filter((f) => f !== Feature.Resolve));
  await startAgent(t, env, server.agentPort, { features });
  await waitFor(() => server.registry.size === 1, 'agent connected');
  const tunnel = server.registry.list()[0].tunnel;
  const err = await unresolved(tunnel.resolve('web.shop.svc', { timeoutMs: 5000 }));
  t.is(err.failure, 'unresolved');
  t.regex(err.message, /web\.shop\.svc: the agent does not resolve names/);
  t.deepEqual(await tunnel.resolve('10.1.1.1', { timeoutMs: 5000 }), { addresses: ['10.1.1.1'], resolver: 'IP literal' });
});
