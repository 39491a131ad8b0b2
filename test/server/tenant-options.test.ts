/**
 * A tenant's settings mapped once (src/server/config/tenant-options.ts): the
 * command line and a tenants file's entry with the same values give the same
 * options, and a reload's update() applies them to the running tenant
 * (src/server/tenants/tenant.ts) as a new tenant would start with them.
 */
import test from 'ava';
import { readSettings } from '../../src/settings/table.js';
import { serverSettings } from '../../src/server/config/settings.js';
import { parseTenants } from '../../src/server/config/tenants-file.js';
import { tenantOptionsOf } from '../../src/server/config/tenant-options.js';
import { TENANT_KEYS, tenantSettings } from '../../src/server/config/tenant-settings.js';
import { keysOfScope } from '../../src/settings/scope.js';
import { Tenant } from '../../src/server/tenants/tenant.js';
import { KanalMetrics } from '../../src/domain/metrics.js';
import { ConnectionBudget } from '../../src/domain/connection-budget.js';
import { captureLogger } from '../helpers/memory-stream.js';

const ENTRY = {
  'server-count': 3,
  'max-agents-per-credential': 2,
  'allowed-destination': ['10.0.0.10:6443'],
  'direct-route': ['10.96.0.0/12:443', 'Metrics-Server.kube-system.svc'],
  'backend-dial-timeout': '7s',
  'destination-dial-timeout': '4s',
  'max-connection-window': 2 * 1024 * 1024,
  'peer-read-timeout': '30s',
  'max-retained-bytes-per-agent': 32 * 1024 * 1024,
  'max-retained-bytes-per-tenant': 64 * 1024 * 1024,
  'dial-rate-per-agent': 7,
};

/** One tenants file's entry with `settings` (and what every entry needs). */
function entry(name: string, settings: Record<string, unknown>) {
  const lines = Object.entries({ name, 'cluster-ca-cert': '/ca.crt', 'uds-name': `/run/${name}.sock`, ...settings }).map(
    ([k, v]) => `    ${k}: ${JSON.stringify(v)}`,
  );
  const [spec] = parseTenants(`apiVersion: kanal.dev/v1alpha1\nkind: TenantsConfig\ntenants:\n  -${lines.join('\n').slice(3)}\n`, 't.yaml');
  return spec;
}

test("a tenants file takes the server table's per-tenant settings and no process-wide one", (t) => {
  const shared = Object.keys(tenantSettings).filter((k) => k in serverSettings);
  t.deepEqual(shared, keysOfScope(serverSettings, ['tenant', 'process-and-tenant']));
  t.deepEqual(shared, [...TENANT_KEYS]);
  for (const k of ['agent-port', 'keepalive-time', 'memory-budget', 'tenants-config', 'log-level', 'enable-lease-controller'])
    t.false(k in tenantSettings, k);
  t.true(shared.length >= 30);
});

test('the command line and a tenants file entry with the same values map to the same options', (t) => {
  const given: Record<string, unknown> = {};
  for (const [name, s] of Object.entries(serverSettings)) given[name] = s.default;
  Object.assign(given, ENTRY, { 'cluster-ca-cert': '/ca.crt', 'uds-name': '/run/a.sock' });
  const fromCommandLine = tenantOptionsOf(readSettings(serverSettings, given));
  const spec = entry('alpha', ENTRY);
  const { maxAgents, quota, ...fromFile } = tenantOptionsOf(spec.settings, spec.settings);
  t.deepEqual(fromFile, fromCommandLine);
  t.is(maxAgents, 1000, "a file's entry has the tenant-wide limits too");
  t.like(quota, { maxConnections: 10_000, dialRate: 500 });
  t.like(fromCommandLine, {
    serverCount: 3,
    backendDialTimeoutMs: 7000,
    destinationDialTimeoutMs: 4000,
    allowedDestinations: ['10.0.0.10:6443'],
    directRoutes: ['10.96.0.0/12:443', 'metrics-server.kube-system.svc'],
  });
  t.like(fromCommandLine.agentLimits, { dialRate: 7 });
  t.deepEqual(fromCommandLine.retainedBytes, { perAgent: 32 * 1024 * 1024, perTenant: 64 * 1024 * 1024 });
});

test("update() applies a reload's settings as a tenant started with them would hold them", (t) => {
  const logs = captureLogger();
  const make = (settings: Record<string, unknown>): Tenant => {
    const spec = entry('alpha', settings);
    return new Tenant({
      ...tenantOptionsOf(spec.settings, spec.settings),
      name: 'alpha',
      serverID: 's',
      resumeTimeoutMs: 0,
      nodeToCp: new ConnectionBudget(100),
      metrics: new KanalMetrics('server', 'alpha'),
      log: logs.log,
    });
  };
  const running = make({});
  const changed = {
    ...ENTRY,
    'max-agents': 5,
    'allowed-destination': ['10.0.0.11:443', '10.0.0.12:443'],
    'direct-route': ['*.cp.internal:8443', '[fd00::/64]'],
  };
  const routes = running.directRoutes;
  t.true(routes.empty, 'no direct route unless configured');
  const next = entry('alpha', changed);
  running.update(tenantOptionsOf(next.settings, next.settings));
  const fresh = make(changed);
  t.is(running.registry.maxAgentsPerCredential, 2);
  t.is(running.registry.maxAgents, 5);
  t.deepEqual(running.allowList.list(), fresh.allowList.list());
  t.is(running.directRoutes, routes, 'the routes are replaced in place, for whoever holds them');
  t.deepEqual(running.directRoutes.list(), fresh.directRoutes.list());
  t.deepEqual(running.directRoutes.list(), ['*.cp.internal:8443', '[fd00::/64]']);
  t.true(running.directRoutes.matches('api.cp.internal', 8443));
  t.is(running.account.cap, 64 * 1024 * 1024);
  t.is(running.account.cap, fresh.account.cap);
  running.close();
  fresh.close();
});

test("a tenants file's malformed direct-route names the tenant, the key, the entry and the forms", (t) => {
  const err = t.throws(() => entry('bad', { 'direct-route': ['fd00::/64'] }));
  t.regex(
    err.message,
    /tenant "bad": direct-route: direct route "fd00::\/64": an IPv6 CIDR goes in brackets, e\.g\. \[fd00::\/64\]:443; expected CIDR\[:PORT\]/,
  );
});
