/**
 * The Kubernetes API stand-in against a client it was not written with:
 * upstream Konnectivity v0.36's proxy-server and proxy-agent (client-go, with
 * upstream's default --kube-api-content-type, protobuf) and the RBAC Kanal
 * ships. Servers keep their leases and review the agent's token through it;
 * the agent's informer (a streaming list) counts the servers; upstream's GC
 * collects an expired lease with a protobuf DeleteOptions precondition.
 * Skips with the reason when upstream's binaries are absent.
 */
import test from 'ava';
import { skippedBecause } from '../helpers/skipped.js';
import fs from 'node:fs/promises';
import path from 'node:path';
import { LabelSelector } from '../../src/kube/labels.js';
import { makeWorkspace } from '../helpers/kanal-processes.js';
import { startUpstreamAgent, startUpstreamServer, upstreamUnavailableReason } from '../helpers/upstream.js';
import { startKonnectivityKubeApi, waitUntil } from '../helpers/kube-stand-in/fixture.js';

const unavailable = upstreamUnavailableReason();
const maybe = unavailable ? test.skip : test;
if (unavailable) skippedBecause('upstream client-go against the Kubernetes API stand-in', unavailable);

const NS = 'kube-system';
const EVERYTHING = LabelSelector.parse('');
const micro = (ms: number): string => new Date(ms).toISOString().replace('Z', '000Z');

maybe(
  'upstream servers keep leases and review tokens, the upstream agent counts servers by leases, all through the stand-in in protobuf',
  async (t) => {
    const ws = await makeWorkspace(t, 'kanal-kube-upstream-');
    const { k, serverKubeconfig, agentKubeconfig } = await startKonnectivityKubeApi(t, ws.dir);
    const tokenFile = path.join(ws.dir, 'agent-token');
    await fs.writeFile(
      tokenFile,
      k.api.tokens.issueServiceAccountToken({
        namespace: NS,
        serviceAccount: 'konnectivity-agent',
        audiences: ['system:konnectivity-server'],
      }),
    );

    // An expired lease of a server long gone: upstream's GC must collect it.
    k.api.leases.create(NS, {
      metadata: { name: 'konnectivity-proxy-server-gone', labels: { 'k8s-app': 'konnectivity-server' } },
      spec: { holderIdentity: 'gone', leaseDurationSeconds: 30, renewTime: micro(Date.now() - 600_000) },
    });

    const serverArgs = [
      '--agent-namespace=kube-system',
      '--agent-service-account=konnectivity-agent',
      '--authentication-audience=system:konnectivity-server',
      `--kubeconfig=${serverKubeconfig}`,
      '--enable-lease-controller',
    ];
    // Upstream refuses --cluster-ca-cert together with token authentication.
    const server1 = await startUpstreamServer(t, ws, { name: 'server-1', agentClientCa: false, extraArgs: serverArgs });
    await startUpstreamServer(t, ws, { name: 'server-2', agentClientCa: false, extraArgs: serverArgs });
    await waitUntil(
      () => ['server-1', 'server-2'].every((s) => k.api.leases.list(NS, EVERYTHING).items.some((l) => l.spec.holderIdentity === s)),
      'both upstream servers hold a lease',
      20_000,
    );

    const agent = await startUpstreamAgent(t, ws, server1, {
      agentID: 'upstream-agent',
      verbosity: 4,
      extraArgs: [`--service-account-token-path=${tokenFile}`, '--count-server-leases', `--kubeconfig=${agentKubeconfig}`],
    });
    await agent.waitForLog(
      /"Determined server count" serverCount=2 source="KNP lease count"/,
      20_000,
      'the agent counts two servers by leases',
    );
    t.pass('the agent authenticated with its token (readyz) and counted two leases');

    await waitUntil(
      () => !k.api.leases.list(NS, EVERYTHING).items.some((l) => l.metadata.name === 'konnectivity-proxy-server-gone'),
      'the expired lease is collected',
      25_000,
    );
    const byUser = (user: string) =>
      new Set(k.api.requests.filter((r) => r.user === user).map((r) => `${r.verb} ${r.resource} ${r.status}`));
    const server = byUser('system:konnectivity-server');
    for (const call of ['create tokenreviews 201', 'create leases 201', 'list leases 200', 'delete leases 200'])
      t.true(server.has(call), call);
    t.true(
      byUser('system:serviceaccount:kube-system:konnectivity-agent').has('watch leases 0'),
      'the agent watches (streaming list) with its own identity',
    );
    t.false(
      [...server, ...byUser('system:serviceaccount:kube-system:konnectivity-agent')].some((c) => / (401|403|406|415|400)$/.test(c)),
      'the shipped RBAC suffices, every body was understood',
    );
  },
);
