/**
 * What the agent port tells a peer that has not proven it belongs to a
 * tenant (src/server/identity/peer-refusals.ts): on a shared server every
 * token refusal to such a peer is the one generic text, whatever the
 * tenant's review said (rejected, wrong audience or account, its API down);
 * a peer whose certificate proved its tenant, and a server of one cluster,
 * still hear the reason. And every gRPC refusal in src/server that sends a
 * text built from values is one whose peer is proven (a list below, kept by
 * hand: a new one must say why its peer may hear what it carries).
 */
import test from 'ava';
import fs from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createAgentService, type AgentServiceOptions } from '../../src/server/agents/agent-service.js';
import { AgentRegistry } from '../../src/server/agents/agent-registry.js';
import { Refusals } from '../../src/domain/refusal-log.js';
import { KanalMetrics } from '../../src/domain/metrics.js';
import type { DestinationDialer } from '../../src/server/destinations/destination-dialer.js';
import type { TokenAuthentication, TokenRefusalKind } from '../../src/server/identity/token-authenticator.js';
import type { AgentCredential } from '../../src/server/identity/agent-credential.js';
import type { IncomingStream } from '../../src/transport/transport.js';
import type { PacketStream } from '../../src/transport/packet-stream.js';
import { GrpcStatus } from '../../src/transport/grpc-status.js';
import { MD_AGENT_ID, MD_AUTHORIZATION } from '../../src/wire/metadata.js';
import { AGENT_NOT_AUTHENTICATED, UNPROVEN_PEER_REFUSALS } from '../../src/server/identity/peer-refusals.js';
import { NO_FEATURES } from '../../src/wire/features.js';
import { captureLogger } from '../helpers/in-process.js';

const KINDS: { kind: TokenRefusalKind; agentFault: boolean }[] = [
  { kind: 'no-token', agentFault: true },
  { kind: 'malformed', agentFault: true },
  { kind: 'rejected', agentFault: true },
  { kind: 'wrong-audience', agentFault: true },
  { kind: 'wrong-identity', agentFault: true },
  { kind: 'unavailable', agentFault: false },
];

/** A reason as a tenant's review words it: naming its account, as the real ones do. */
const reasonOf = (kind: TokenRefusalKind): string => `${kind}: this server accepts only system:serviceaccount:secret-customer-d:agent`;

/** The status one stream is refused with by an agent service whose token review answers `kind`. */
async function refusalFor(
  kind: TokenRefusalKind,
  agentFault: boolean,
  hideTenant: boolean,
  context?: AgentCredential,
): Promise<[GrpcStatus, string]> {
  const logs = captureLogger();
  const authenticate = (): Promise<TokenAuthentication> =>
    Promise.resolve({ ok: false, refusal: { kind, reason: reasonOf(kind), agentFault } });
  const opts: AgentServiceOptions = {
    serverID: 's',
    serverCount: 1,
    registry: new AgentRegistry(),
    // Never reached: every stream here is refused before it is admitted.
    destinations: {} as unknown as DestinationDialer,
    features: NO_FEATURES,
    log: logs.log,
    refusals: new Refusals(logs.log, new KanalMetrics('server')),
    tokens: { authenticator: { authenticate } },
    hideTenant,
  };
  const serve = createAgentService(opts);
  return new Promise((resolve, reject) => {
    const incoming: IncomingStream<AgentCredential> = {
      metadata: new Map([
        [MD_AGENT_ID, ['node-1']],
        [MD_AUTHORIZATION, ['Bearer x.y.z']],
      ]),
      peer: '127.0.0.1:1',
      context,
      accept: (): PacketStream => {
        reject(new Error('accepted'));
        throw new Error('accepted');
      },
      reject: (code, message) => resolve([code, message]),
    };
    serve(incoming);
  });
}

test('a shared server: every token refusal to a peer no certificate proved reads the one generic text', async (t) => {
  for (const { kind, agentFault } of KINDS) {
    const [code, message] = await refusalFor(kind, agentFault, true);
    t.is(code, AGENT_NOT_AUTHENTICATED.code, kind);
    t.is(message, AGENT_NOT_AUTHENTICATED.message, kind);
    t.true(UNPROVEN_PEER_REFUSALS.includes(message));
    t.false(message.includes('secret-customer-d'), kind);
  }
});

test("a peer whose certificate proved its tenant, or any peer of a one-cluster server, hears the review's reason", async (t) => {
  const proven: AgentCredential = { key: 'x509\nCN=ca\n\nCN=node-1', subject: 'CN=node-1 (issuer CN=ca)' };
  for (const { kind, agentFault } of KINDS) {
    const expected: [GrpcStatus, string] = [agentFault ? GrpcStatus.UNAUTHENTICATED : GrpcStatus.UNAVAILABLE, reasonOf(kind)];
    t.deepEqual(await refusalFor(kind, agentFault, true, proven), expected, `${kind}, proven by certificate`);
    t.deepEqual(await refusalFor(kind, agentFault, false), expected, `${kind}, one cluster`);
  }
});

const SRC = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../src/server');

/**
 * gRPC refusals whose text is built from values, each with why its peer may
 * hear it. Any other `.reject(` in src/server must send a constant.
 */
const PROVEN_REFUSALS: Record<string, string> = {
  'agents/agent-service.ts: incoming.reject(agentFault ? GrpcStatus.UNAUTHENTICATED : GrpcStatus.UNAVAILABLE, reason)':
    'the else of `hideTenant && !incoming.context`: a certificate proved the peer, or the server has one cluster',
  'agents/agent-service.ts: incoming.reject(code, message)': 'refuse() of serveAgentStream: the stream has authenticated',
  'server.ts: incoming.reject(GrpcStatus.UNAUTHENTICATED, `this server serves no tenant for this agent: ${detail}`)':
    'the else of `connection.credential === undefined`: its tenant verified its certificate',
  'server.ts: incoming.reject(code, message)': 'withContext() passes a refusal on unchanged',
};

async function sources(dir: string): Promise<string[]> {
  const out: string[] = [];
  for (const e of await fs.readdir(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) out.push(...(await sources(p)));
    else if (e.name.endsWith('.ts')) out.push(p);
  }
  return out;
}

test('every refusal in src/server that sends a text made of values is one to a proven peer', async (t) => {
  const found: string[] = [];
  for (const file of await sources(SRC)) {
    const text = await fs.readFile(file, 'utf8');
    for (const m of text.matchAll(/incoming\.reject\(([^;]*?)\)[;,]?$/gms)) {
      const args = m[1].replace(/\s+/g, ' ').trim();
      const constant = /^(AGENT_NOT_AUTHENTICATED\.code, AGENT_NOT_AUTHENTICATED\.message|GrpcStatus\.[A-Z_]+, '[^'$`]*')$/.test(args);
      if (!constant) found.push(`${path.relative(SRC, file)}: incoming.reject(${args})`);
    }
  }
  t.true(found.length > 0, 'the scan sees the refusals');
  for (const f of found) t.truthy(PROVEN_REFUSALS[f], `${f}: sends a text made of values to a peer not listed as proven`);
  t.deepEqual(found.filter((f) => PROVEN_REFUSALS[f]).sort(), Object.keys(PROVEN_REFUSALS).sort(), 'every listed refusal still exists');
});
