/**
 * The tenants file's `clients` key (src/server/config/tenants-file.ts): checked
 * with the tenant's other settings, its mistakes named with the tenant; mapped
 * by tenantOptionsOf, and a reload's list applied in place (Tenant.update).
 */
import test from 'ava';
import type { Logger } from 'pino';
import { parseTenants, TenantsFileError } from '../../../src/server/config/tenants-file.js';
import { tenantOptionsOf } from '../../../src/server/config/tenant-options.js';
import { loadClients } from '../../../src/server/config/clients-config.js';
import { Tenant } from '../../../src/server/tenants/tenant.js';
import { KanalMetrics } from '../../../src/domain/metrics.js';
import { ConnectionBudget } from '../../../src/domain/connection-budget.js';
import { captureLogger } from '../../helpers/memory-stream.js';
import { PassThrough } from 'node:stream';
import { HttpConnectFrontend } from '../../../src/server/frontends/http-connect-frontend.js';
import { ForwardPool } from '../../../src/server/frontends/forward-pool.js';

const HEAD =
  'apiVersion: kanal.dev/v1alpha1\nkind: TenantsConfig\ntenants:\n- name: alpha\n  cluster-ca-cert: /ca.crt\n  uds-name: /run/alpha.sock\n';

/** Tenant alpha of `spec`, as a server builds it. */
function alphaTenant(spec: ReturnType<typeof parseTenants>[number], log: Logger): Tenant {
  return new Tenant({
    ...tenantOptionsOf(spec.settings, spec.settings),
    name: 'alpha',
    serverID: 's',
    resumeTimeoutMs: 0,
    nodeToCp: new ConnectionBudget(10),
    metrics: new KanalMetrics('server', 'alpha'),
    log,
  });
}

test('a tenant with clients: the list is its spec; a mistake names the tenant and the entry', (t) => {
  const [spec] = parseTenants(
    `${HEAD}  clients:\n  - name: prom\n    uid: 1000\n    allow: [{ cidr: 10.0.0.0/8, port: 9100 }]\n`,
    't.yaml',
  );
  t.is(spec.clients?.[0].name, 'prom');
  const err = t.throws(() => parseTenants(`${HEAD}  clients:\n  - name: prom\n    service-account: monitoring/prometheus\n`, 't.yaml'), {
    instanceOf: TenantsFileError,
  });
  t.regex(
    err?.message ?? '',
    /tenant "alpha": clients\[0\] "prom": service-account "monitoring\/prometheus": its tokens are checked by TokenReview, which needs the tenant's token review: agent-namespace/,
  );
});

test("a reload's clients: list applies in place; removing it gives the kube-apiserver back everything", (t) => {
  const logs = captureLogger('info');
  const [plain] = parseTenants(HEAD, 't.yaml');
  const tenant = alphaTenant(plain, logs.log);
  t.teardown(() => tenant.close());
  t.false(tenant.clients.configured);
  const [withClients] = parseTenants(`${HEAD}  clients:\n  - name: prom\n    uid: 1000\n`, 't.yaml');
  const { entries } = loadClients(withClients.clients ?? []);
  tenant.update(tenantOptionsOf(withClients.settings, withClients.settings, entries));
  t.true(tenant.clients.configured);
  tenant.update(tenantOptionsOf(plain.settings, plain.settings));
  t.false(tenant.clients.configured);
});

test("a tenant's close closes the forward proxy's idle pooled connections to its destinations", (t) => {
  const logs = captureLogger('info');
  const [plain] = parseTenants(HEAD, 't.yaml');
  const tenant = alphaTenant(plain, logs.log);
  const door = tenant.frontends.get('http-connect');
  if (!(door instanceof HttpConnectFrontend)) return t.fail('the tenant has no HTTP door');
  const idle = new PassThrough();
  door.pool.put(ForwardPool.key('prom', '10.0.0.5:9100'), idle);
  t.is(door.pool.size, 1);
  tenant.close();
  t.is(door.pool.size, 0);
  t.true(idle.destroyed);
});
