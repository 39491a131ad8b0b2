/**
 * What a caller off this host learns from the health and admin ports
 * (docs/multi-tenant.md, "What a caller of the health port learns"). A
 * network namespace of the test's own gives the server an address that is
 * not loopback (192.0.2.10 on the namespace's lo: a connection to it comes
 * from it), so callers from 127.0.0.1 and from 192.0.2.10 reach the same
 * ports. From 192.0.2.10: /readyz is ready or not with no tenant name, count
 * or answer to ?tenant= (a tenant that exists and one that does not read the
 * same), /metrics is refused (--health-metrics auto with a tenants file); from
 * 127.0.0.1 all of it is served. An admin port on 192.0.2.10 with
 * --enable-profiling refuses the heap snapshot and CPU profile as it refuses /status.
 */
import test from 'ava';
import fs from 'node:fs/promises';
import path from 'node:path';
import { makeWorkspace } from '../helpers/kanal-processes.js';
import { createTenantNetns } from '../helpers/tenant-netns.js';
import { tenantsFile, tenantsServerArgs } from '../helpers/tenants.js';
import { skippedBecause } from '../helpers/skipped.js';
import { netnsUnavailableReason } from '../../kit/launch/netns.js';

const OFF_LOOPBACK = '192.0.2.10';
const [AGENT_PORT, HEALTH_PORT, ADMIN_PORT] = [18091, 18092, 18095];
const TENANT = 'secret-customer';

const unavailable = await netnsUnavailableReason();
if (unavailable) skippedBecause('the health and admin ports to a caller off loopback', unavailable);
else
  test('off loopback: /readyz names no tenant and tells none from a missing one, /metrics and profiles are refused; on loopback all is served', async (t) => {
    t.timeout(90_000);
    const ws = await makeWorkspace(t);
    const ns = await createTenantNetns(t, ws.dir, [], [OFF_LOOPBACK]);
    const file = path.join(ws.dir, 'tenants.yaml');
    await fs.writeFile(
      file,
      tenantsFile([`  - name: ${TENANT}\n    cluster-ca-cert: ${ws.pki.caCert}\n    uds-name: ${path.join(ws.dir, 'tenant.sock')}\n`]),
    );
    const server = ns.kanal('server', [
      ...tenantsServerArgs({
        file,
        defaultPair: { cert: ws.pki.serverCert, key: ws.pki.serverKey },
        agentHost: '127.0.0.1',
        agentPort: AGENT_PORT,
        healthPort: HEALTH_PORT,
      }),
      '--health-bind-address',
      '0.0.0.0',
      '--admin-bind-address',
      OFF_LOOPBACK,
      '--admin-port',
      String(ADMIN_PORT),
      '--enable-profiling',
    ]);
    const local = `http://127.0.0.1:${HEALTH_PORT}`;
    const remote = `http://${OFF_LOOPBACK}:${HEALTH_PORT}`;
    const detail = await ns.waitStatus(`${local}/readyz`, 200, 30_000, server);
    t.regex(detail, new RegExp(`tenant ${TENANT}: no agent connected`), 'on loopback: the detail');
    t.regex((await ns.get(`${local}/readyz?tenant=nosuch`)).body, /no tenant "nosuch" here/);

    const plain = await ns.get(`${remote}/readyz`);
    t.deepEqual(plain, { status: 200, body: 'ok\n' }, 'off loopback: ready, and nothing else');
    t.deepEqual(await ns.get(`${remote}/readyz?tenant=${TENANT}`), plain, 'an existing tenant');
    t.deepEqual(await ns.get(`${remote}/readyz?tenant=nosuch`), plain, 'reads as a missing one');
    t.is((await ns.get(`${remote}/healthz`)).status, 200);

    const metrics = await ns.get(`${remote}/metrics`);
    t.is(metrics.status, 403);
    t.false(metrics.body.includes(TENANT));
    t.regex(metrics.body, /--health-metrics/);
    const scraped = await ns.get(`${local}/metrics`);
    t.is(scraped.status, 200);
    t.true(scraped.body.includes(`tenant="${TENANT}"`), 'on loopback the tenant-labelled series are served');

    const admin = `http://${OFF_LOOPBACK}:${ADMIN_PORT}`;
    for (const p of ['/debug/kanal/heap-snapshot', '/debug/kanal/cpu-profile?seconds=1', '/status']) {
      const r = await ns.get(`${admin}${p}`);
      t.is(r.status, 403, p);
      t.regex(r.body, /loopback address/, p);
    }
    t.is((await ns.get(`${admin}/metrics`)).status, 200, 'the admin port still serves /metrics');
  });
