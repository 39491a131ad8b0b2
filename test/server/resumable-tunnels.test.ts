/**
 * Who may resume a tunnel (src/server/agents/resumable-tunnels.ts,
 * docs/trust-model.md): only a stream of the credential and agentID that
 * opened it, naming its token; a new process of the same agent ends its
 * detached tunnels; detached tunnels are bounded per credential.
 */
import test from 'ava';
import { ResumableTunnels } from '../../src/server/agents/resumable-tunnels.js';
import { Tunnel } from '../../src/tunnel/tunnel.js';
import { Feature } from '../../src/wire/features.js';
import type { AgentCredential } from '../../src/server/identity/agent-credential.js';
import { captureLogger, createMemoryLink, waitFor } from '../helpers/memory-stream.js';

const FEATURES = new Set([Feature.Window, Feature.HalfClose, Feature.Resume]);
const alice: AgentCredential = { key: 'x509\nCN=ca\n\nCN=alice', subject: 'CN=alice' };
const mallory: AgentCredential = { key: 'x509\nCN=ca\n\nCN=mallory', subject: 'CN=mallory' };

/** A server-side tunnel with resume; its stream can be lost with lose(). */
function serverTunnel(t: import('ava').ExecutionContext): { tunnel: Tunnel; lose: () => Promise<void> } {
  const link = createMemoryLink();
  const tunnel = new Tunnel(link.b, { side: 'server', features: FEATURES, log: captureLogger('silent').log, resumeTimeoutMs: 10_000 });
  t.teardown(() => tunnel.close());
  return {
    tunnel,
    lose: async () => {
      link.a.destroy(new Error('connection reset'));
      await waitFor(() => tunnel.detached, 'detached');
    },
  };
}

test('a token resumes only for the credential and agentID that opened the tunnel', async (t) => {
  const store = new ResumableTunnels(2);
  const { tunnel, lose } = serverTunnel(t);
  const token = store.newToken();
  store.add(token, tunnel, alice, 'node-1', 'proc-a');
  await lose();
  t.deepEqual(store.claim([token], mallory, 'node-1'), { miss: 'other_agent' }, 'a stolen token is worth nothing to another credential');
  t.deepEqual(store.claim([token], alice, 'node-2'), { miss: 'other_agent' }, 'nor to another agent of the same credential');
  t.deepEqual(store.claim(['not-a-token'], alice, 'node-1'), { miss: 'unknown' });
  const claimed = store.claim(['junk', token], alice, 'node-1');
  t.true('tunnel' in claimed && claimed.tunnel === tunnel);
  t.true(tunnel.detached, 'claiming alone changes nothing');
});

test('a new process of the same agent closes its detached tunnels; the same process does not', async (t) => {
  const store = new ResumableTunnels(2);
  const { tunnel, lose } = serverTunnel(t);
  store.add(store.newToken(), tunnel, alice, 'node-1', 'proc-a');
  await lose();
  t.is(store.closeDetachedOf(alice, 'node-1', 'proc-a'), 0);
  t.is(store.closeDetachedOf(mallory, 'node-1', 'proc-b'), 0, "another credential's agent cannot end it");
  t.false(tunnel.closed);
  t.is(store.closeDetachedOf(alice, 'node-1', 'proc-b'), 1);
  t.true(tunnel.closed);
  t.deepEqual(store.detached(), { tunnels: 0, connections: 0 });
});

test('detached tunnels are bounded per credential: past the bound the oldest is closed', async (t) => {
  const store = new ResumableTunnels(2);
  const tunnels = [serverTunnel(t), serverTunnel(t), serverTunnel(t)];
  for (const [i, x] of tunnels.entries()) store.add(store.newToken(), x.tunnel, alice, `node-${i}`, 'p');
  const other = serverTunnel(t);
  store.add(store.newToken(), other.tunnel, certificateCredentialOf('bob'), 'node-9', 'p');
  await other.lose();
  for (const x of tunnels) await x.lose();
  t.true(tunnels[0].tunnel.closed, 'the oldest of alice went');
  t.false(tunnels[1].tunnel.closed);
  t.false(tunnels[2].tunnel.closed);
  t.false(other.tunnel.closed, "bob's is not alice's to lose");
  t.is(store.detached().tunnels, 3);
});

function certificateCredentialOf(cn: string): AgentCredential {
  return { key: `x509\nCN=ca\n\nCN=${cn}`, subject: `CN=${cn}` };
}
