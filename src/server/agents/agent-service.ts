/**
 * Accepts AgentService/Connect streams: checks the agent's metadata, admits
 * it under its credential (agent-registry.ts), negotiates Kanal features,
 * answers with serverID/serverCount and registers the tunnel so frontends can
 * dial through it. Every log line about an agent names its credential.
 */
import type { Logger } from 'pino';
import type { IncomingStream } from '../../transport/transport.js';
import { GrpcStatus } from '../../transport/grpc-status.js';
import {
  MD_AGENT_ID,
  MD_AGENT_IDENTIFIERS,
  MD_AUTHORIZATION,
  MD_KANAL_FEATURES,
  MD_KANAL_INCARNATION,
  MD_KANAL_RESUME,
  MD_KANAL_RESUME_TOKEN,
  MD_KANAL_RESUMED,
  MD_KANAL_REFUSED_TARGETS,
  MD_KANAL_TARGETS,
  MAX_TARGETS_NAMED,
  MAX_TARGET_CHARS,
  MD_SERVER_COUNT,
  MD_SERVER_ID,
  firstValue,
} from '../../wire/metadata.js';
import { Feature, formatFeatures, intersectFeatures, parseFeatures, type FeatureSet } from '../../wire/features.js';
import { Tunnel } from '../../tunnel/tunnel.js';
import { resolveLimits, type TunnelLimitName, type TunnelLimits } from '../../tunnel/limits.js';
import { parseAgentIdentifiers, type AgentIdentifiers } from '../../wire/agent-identifiers.js';
import type { AgentRegistry, AdmissionRefusal } from './agent-registry.js';
import type { AgentBackend } from '../routing/agent-backend.js';
import { tokenCredential, unauthenticatedCredential, type AgentCredential } from '../identity/agent-credential.js';
import type { TokenAuthenticator, TokenRefusalKind } from '../identity/token-authenticator.js';
import { AGENT_NOT_AUTHENTICATED } from '../identity/peer-refusals.js';
import type { Refusals } from '../../domain/refusal-log.js';
import type { DestinationDialer } from '../destinations/destination-dialer.js';
import type { KanalMetrics } from '../../domain/metrics.js';
import { countTunnelLimit } from '../../tunnel/limit-metrics.js';
import type { ConnectionAuditor } from '../../audit/connection-auditor.js';
import type { RefusalReasons } from '../../tunnel/limit-reports.js';
import { truncateForLog } from '../../common/log-safety.js';
import { peerHost } from '../../domain/refusal-log.js';
import type { RefusalReason } from '../../domain/refusal-reason.js';
import { errorMessage } from '../../common/error-message.js';
import { MAX_RESUME_TOKEN_CHARS, MAX_RESUME_TOKENS, type ResumableTunnels } from './resumable-tunnels.js';
import type { ResumeMetrics } from '../../domain/resume-metrics.js';
import type { LedgerAccount } from '../../domain/retention-ledger.js';

// The settings these messages name, spelt once here: this module sits below the server's table (src/server/config/settings.ts) in the layers.
const PEER_READ_TIMEOUT = '--peer-read-timeout';

/** On an agent tunnel the server performs node -> control plane dials (inbound) and dials toward the node (outbound). */
const AGENT_TUNNEL_REFUSALS: RefusalReasons = {
  maxPendingDials: 'agent_pending_dials',
  maxInboundConnections: 'agent_node_to_cp_connections',
  maxOutboundConnections: 'agent_cp_to_node_connections',
  dialRate: 'throttled',
};

/** The server flags behind each limit of an agent tunnel, named in log lines. */
const AGENT_TUNNEL_LIMIT_FLAGS: Partial<Record<TunnelLimitName, string>> = {
  maxPendingDials: '--max-pending-dials-per-agent',
  maxInboundConnections: '--max-node-to-cp-connections-per-agent',
  maxOutboundConnections: '--max-cp-to-node-connections-per-agent',
  dialRate: '--dial-rate-per-agent',
  pauseReadingQueuedBytes: PEER_READ_TIMEOUT,
  maxQueuedBytes: PEER_READ_TIMEOUT,
  peerReadTimeoutMs: PEER_READ_TIMEOUT,
};

export interface AgentServiceOptions {
  serverID: string;
  serverCount: number;
  registry: AgentRegistry;
  destinations: DestinationDialer;
  features: FeatureSet;
  limits?: Partial<TunnelLimits>;
  log: Logger;
  metrics?: KanalMetrics;
  /** Counts every refused stream and logs it, rate-limited per peer and reason. */
  refusals: Refusals;
  /**
   * Service account token authentication (docs/kubernetes-api.md): every stream's bearer token
   * is reviewed before anything else, and the token's identity is the
   * agent's credential.
   */
  tokens?: { authenticator: Pick<TokenAuthenticator, 'authenticate'> };
  /**
   * A tenant of a shared server: a token refusal to a peer no certificate
   * proved this tenant's reads the same for every tenant and for none
   * (identity/peer-refusals.ts); the server's log keeps the reason.
   */
  hideTenant?: boolean;
  /** Told of every connection of an agent tunnel as it closes (a tenant's quota gives its ticket back). */
  onConnectionClosed?: (connection: object) => void;
  /** Writes each ended connection's log line and audit record, and each dial an agent asked for that made none. */
  auditor?: ConnectionAuditor;
  /**
   * Resume (docs/protocol.md): offered when set. A tunnel whose stream is
   * lost keeps its connections `timeoutMs`; a new stream of the same
   * credential and agentID naming its token takes it over.
   */
  resume?: { timeoutMs: number; tunnels: ResumableTunnels; metrics: ResumeMetrics };
  /**
   * What each agent's connections hold is charged to its account (credential
   * + agentID) below the tenant's, capped at `perAgentBytes` retained
   * (docs/limits.md, "Retained bytes").
   */
  retention?: { tenant: LedgerAccount; perAgentBytes: number };
}

/** Host names and UUIDs fit; longer IDs would ride on every log line of the agent. */
export const MAX_AGENT_ID_LENGTH = 253;

/** kanal_refusals_total{reason} of each token refusal. */
const TOKEN_REFUSALS: Record<TokenRefusalKind, RefusalReason> = {
  'no-token': 'agent_token_no_token',
  malformed: 'agent_token_malformed',
  rejected: 'agent_token_rejected',
  'wrong-audience': 'agent_token_wrong_audience',
  'wrong-identity': 'agent_token_wrong_identity',
  unavailable: 'agent_token_unavailable',
};

const REFUSALS: Record<AdmissionRefusal, string> = {
  agent_credential_full: 'its credential already holds as many live agents as allowed',
  agent_tunnels_full: 'the agent already holds as many live tunnels as allowed',
  agent_admissions_busy: 'too many tunnels of its credential are being admitted at once',
  agent_tenant_full: 'its tenant already has as many agents as allowed',
};

export function createAgentService(opts: AgentServiceOptions): (incoming: IncomingStream<AgentCredential>) => void {
  const tokens = opts.tokens;
  if (!tokens) return (incoming) => serveAgentStream(incoming, incoming.context, opts);
  return (incoming) => {
    tokens.authenticator.authenticate(incoming.metadata.get(MD_AUTHORIZATION) ?? [], peerHost(incoming.peer)).then(
      (result) => {
        if (result.ok) {
          serveAgentStream(incoming, tokenCredential(result.identity), opts);
          return;
        }
        const { kind, reason, agentFault } = result.refusal;
        // The connection's certificate (when --cluster-ca-cert is set too) says who was refused.
        const who = incoming.context ? { credential: incoming.context.subject } : {};
        opts.refusals.refuse({
          reason: TOKEN_REFUSALS[kind],
          peer: incoming.peer,
          fields: { ...who, reason },
          message: `refused agent stream: service account token ${kind}`,
          detail: kind,
        });
        // An unproven peer learns nothing of the tenant it named: not even whether its API is up.
        if (opts.hideTenant && !incoming.context) incoming.reject(AGENT_NOT_AUTHENTICATED.code, AGENT_NOT_AUTHENTICATED.message);
        // The agent cannot fix an API outage: UNAVAILABLE tells it to retry.
        else incoming.reject(agentFault ? GrpcStatus.UNAUTHENTICATED : GrpcStatus.UNAVAILABLE, reason);
      },
      (err: Error) => {
        opts.log.error({ peer: incoming.peer, err: err.message }, 'checking an agent token failed');
        incoming.reject(GrpcStatus.INTERNAL, 'the server could not check the token');
      },
    );
  };
}

/** An agent stream refused before it is admitted; `message` is what the agent logs, `what` what this server logs. */
interface StreamRefusal {
  reason: RefusalReason;
  what: string;
  code: GrpcStatus;
  message: string;
  fields?: Record<string, unknown>;
}

/** An agent stream the registry admitted, with who it is. */
interface AdmittedStream {
  incoming: IncomingStream<AgentCredential>;
  credential: AgentCredential;
  agentID: string;
  identifiers: AgentIdentifiers;
  log: Logger;
}

/** Checks the metadata and admits the stream under `context`, who authenticated it. */
function serveAgentStream(
  incoming: IncomingStream<AgentCredential>,
  context: AgentCredential | undefined,
  opts: AgentServiceOptions,
): void {
  // The agent listener always says who it is; a stream injected without (a test's) is its own peer.
  const credential = context ?? unauthenticatedCredential(incoming.peer);
  /** Counts, logs (rate-limited per peer, reason and credential) and answers a refusal; `message` is what the agent logs. */
  const refuse = ({ reason, what, code, message, fields = {} }: StreamRefusal): void => {
    opts.refusals.refuse({
      reason,
      peer: incoming.peer,
      fields: { credential: credential.subject, ...fields, reason: message },
      message: `refused agent stream: ${what}`,
      detail: credential.subject,
    });
    incoming.reject(code, message);
  };
  const agentIDs = incoming.metadata.get(MD_AGENT_ID) ?? [];
  if (agentIDs.length !== 1 || !agentIDs[0]) {
    refuse({
      reason: 'agent_metadata',
      what: 'expected exactly one agentID',
      code: GrpcStatus.INVALID_ARGUMENT,
      message: `expected exactly one agentID in the metadata, got ${agentIDs.length}`,
    });
    return;
  }
  const agentID = agentIDs[0];
  if (agentID.length > MAX_AGENT_ID_LENGTH) {
    const message = `agentID is ${agentID.length} characters long; at most ${MAX_AGENT_ID_LENGTH} are accepted`;
    refuse({
      reason: 'agent_metadata',
      what: 'agentID too long',
      code: GrpcStatus.INVALID_ARGUMENT,
      message,
      fields: { length: agentID.length },
    });
    return;
  }
  let identifiers: AgentIdentifiers;
  try {
    identifiers = parseAgentIdentifiers(firstValue(incoming.metadata, MD_AGENT_IDENTIFIERS) ?? '');
  } catch (err) {
    refuse({
      reason: 'agent_metadata',
      what: 'bad agentIdentifiers',
      code: GrpcStatus.INVALID_ARGUMENT,
      message: errorMessage(err),
      fields: { agentID },
    });
    return;
  }
  const log = opts.log.child({ agentID, credential: credential.subject });
  const admitted = opts.registry.admit(credential, agentID, () => accept({ incoming, credential, agentID, identifiers, log }, opts));
  admitted.then(
    (admission) => {
      if (!admission.ok) {
        refuse({
          reason: admission.reason,
          what: REFUSALS[admission.reason],
          code: GrpcStatus.RESOURCE_EXHAUSTED,
          message: admission.message,
          fields: { agentID },
        });
        return;
      }
      for (const old of admission.replaced) {
        log.warn(
          { peer: incoming.peer, replacedPeer: old.peer, replacedAgentID: old.agentID, since: old.connectedAt.toISOString() },
          'replaced a stale tunnel of the same credential',
        );
        opts.metrics?.deadTunnels.inc({ reason: 'replaced' });
      }
      const others = opts.registry.otherHolders(agentID, credential);
      if (others.length > 0) {
        log.warn(
          { otherCredentials: others.slice(0, 3) },
          'another credential announces the same agentID; they are separate agents and share nothing',
        );
      }
      log.info(
        {
          peer: incoming.peer,
          features: formatFeatures(admission.backend.tunnel.features) || 'none',
          identifiers: truncateForLog(firstValue(incoming.metadata, MD_AGENT_IDENTIFIERS) ?? '', 200),
          tunnels: opts.registry.size,
          agents: opts.registry.agentCount,
        },
        'agent connected',
      );
    },
    (err: Error) => {
      // Nothing was registered; never let a failed admission become an unhandled rejection.
      log.error({ peer: incoming.peer, err: err.message }, 'admitting an agent stream failed');
      incoming.reject(GrpcStatus.INTERNAL, 'the server could not admit this stream');
    },
  );
}

/** The resume tokens an agent names (bounded in number and length; the rest is ignored). */
function askedTokens(incoming: IncomingStream<AgentCredential>): string[] {
  const header = firstValue(incoming.metadata, MD_KANAL_RESUME) ?? '';
  return header
    .split(',', MAX_RESUME_TOKENS)
    .map((t) => t.trim())
    .filter((t) => t.length > 0 && t.length <= MAX_RESUME_TOKEN_CHARS);
}

/** The destinations an agent's --target listeners dial (bounded in number and length; the rest is ignored). */
function namedTargets(incoming: IncomingStream<AgentCredential>): string[] {
  return (firstValue(incoming.metadata, MD_KANAL_TARGETS) ?? '')
    .split(',', MAX_TARGETS_NAMED)
    .map((t) => t.trim())
    .filter((t) => t.length > 0 && t.length <= MAX_TARGET_CHARS);
}

/** The detached tunnel this stream resumes, if it names one it may take (logged and counted when it may not). */
function claimTunnel(
  { incoming, credential, agentID, log }: AdmittedStream,
  features: FeatureSet,
  resume: NonNullable<AgentServiceOptions['resume']>,
): { token: string; tunnel: Tunnel } | undefined {
  const asked = askedTokens(incoming);
  if (asked.length === 0) return undefined;
  const claimed = resume.tunnels.claim(asked, credential, agentID);
  if ('tunnel' in claimed && formatFeatures(claimed.tunnel.features) === formatFeatures(features)) return claimed;
  resume.metrics.results.inc({ result: 'refused' });
  const why =
    'miss' in claimed && claimed.miss === 'other_agent'
      ? 'it belongs to another credential or agentID'
      : 'miss' in claimed
        ? 'this server does not hold it (restarted, or it expired)'
        : 'the stream negotiated other features';
  log.info({ peer: incoming.peer, reason: why }, 'agent asked to resume a tunnel it cannot take; it starts a new one');
  return undefined;
}

/** Answers the stream and builds the agent's tunnel, or resumes its detached one (called by the registry once admitted). */
function accept(admitted: AdmittedStream, opts: AgentServiceOptions): AgentBackend {
  const { incoming, credential, agentID, identifiers, log } = admitted;
  const features = intersectFeatures(parseFeatures(firstValue(incoming.metadata, MD_KANAL_FEATURES)), opts.features);
  const headers: Record<string, string> = {
    [MD_SERVER_ID]: opts.serverID,
    [MD_SERVER_COUNT]: String(opts.serverCount),
  };
  if (features.size > 0) headers[MD_KANAL_FEATURES] = formatFeatures(features);
  if (features.has(Feature.NodeDial)) {
    const refused = namedTargets(incoming).filter((t) => !opts.destinations.allows(t));
    if (refused.length > 0) headers[MD_KANAL_REFUSED_TARGETS] = refused.join(',');
  }
  const resume = features.has(Feature.Resume) ? opts.resume : undefined;
  const claimed = resume && claimTunnel(admitted, features, resume);
  // An agent without an incarnation (upstream's, or resume off) is another process than any that resumes.
  const incarnation = (firstValue(incoming.metadata, MD_KANAL_INCARNATION) ?? '').slice(0, MAX_RESUME_TOKEN_CHARS);
  if (!claimed && opts.resume) {
    const closed = opts.resume.tunnels.closeDetachedOf(credential, agentID, incarnation);
    if (closed > 0) log.info({ peer: incoming.peer, tunnels: closed }, 'closed the detached tunnels of a restarted agent');
  }
  const token = claimed?.token ?? resume?.tunnels.newToken();
  if (token) headers[MD_KANAL_RESUME_TOKEN] = token;
  if (claimed) headers[MD_KANAL_RESUMED] = claimed.token;
  const stream = incoming.accept(headers);
  const tunnel = claimed?.tunnel.reattach(stream) ? claimed.tunnel : newTunnel(admitted, stream, features, opts);
  if (resume && token && tunnel !== claimed?.tunnel) {
    resume.tunnels.add(token, tunnel, credential, agentID, incarnation);
    resume.metrics.watch(tunnel);
    tunnel.on('resume-expired', () =>
      log.warn(
        { resumeTimeoutMs: resume.timeoutMs, connections: tunnel.stats().connections },
        'agent tunnel not resumed in time; its connections are closed',
      ),
    );
  }
  if (claimed) log.info({ peer: incoming.peer, connections: tunnel.stats().connections }, 'agent tunnel resumed on a new stream');
  const backend: AgentBackend = {
    agentID,
    credential,
    identifiers,
    tunnel,
    liveness: incoming.liveness,
    peer: incoming.peer,
    connectedAt: new Date(),
  };
  const liveness = incoming.liveness;
  const onQuiet = (): void => log.warn({ peer: incoming.peer }, 'agent tunnel quiet: a PING went unanswered; dials prefer other tunnels');
  const onAlive = (): void => log.info({ peer: incoming.peer }, 'agent tunnel answers PINGs again');
  liveness?.on('quiet', onQuiet).on('alive', onAlive);
  /** This stream's end: a detachment (the tunnel waits for a resume) or the tunnel's close; the backend leaves the registry either way. */
  const onDetached = (err: Error): void => streamEnded(err, true);
  const onClose = (err: Error | undefined): void => streamEnded(err, false);
  const streamEnded = (err: Error | undefined, detached: boolean): void => {
    tunnel.off('detached', onDetached).off('close', onClose);
    liveness?.off('quiet', onQuiet).off('alive', onAlive);
    opts.registry.remove(backend);
    const fields = {
      peer: incoming.peer,
      reason: err?.message ?? 'stream ended',
      tunnels: opts.registry.size,
      agents: opts.registry.agentCount,
    };
    if (detached)
      log.warn(
        { ...fields, connections: tunnel.stats().connections, resumeTimeoutMs: opts.resume?.timeoutMs },
        'agent tunnel lost; its connections wait for it to resume',
      );
    else log.info(fields, 'agent disconnected');
  };
  tunnel.on('detached', onDetached).on('close', onClose);
  return backend;
}

function newTunnel(
  { credential, agentID, log }: AdmittedStream,
  stream: ReturnType<IncomingStream<AgentCredential>['accept']>,
  features: FeatureSet,
  opts: AgentServiceOptions,
): Tunnel {
  const resume = opts.resume;
  const party = { agent: { id: agentID, credential: credential.subject } };
  const account = opts.retention?.tenant
    .child('agent', `${credential.key}\0${agentID}`, opts.retention.perAgentBytes, (_agent, heldBytes, connections) => {
      log.warn(
        { heldBytes, connections, refusal: 'memory_budget' },
        "closed the agent's connections: the server's memory budget is spent and this agent held the most",
      );
      opts.metrics?.refusals.inc({ reason: 'memory_budget' }, connections);
      opts.metrics?.recent.add('memory_budget');
    })
    .use();
  // The tunnel's own recent refusals (tunnel.recent) are fed once it exists: neither hook runs in its constructor.
  const tunnel: Tunnel = new Tunnel(stream, {
    side: 'server',
    features,
    log,
    limits: opts.limits,
    // The agent's, not this stream's: a reconnect or a second tunnel of it shares what the others left.
    allowance: opts.registry.allowanceFor(credential, agentID, resolveLimits(opts.limits)),
    dialHandler: features.has(Feature.NodeDial)
      ? (dial) => opts.destinations.dial({ agentID, credential: credential.subject, recent: tunnel.recent }, dial)
      : undefined,
    refuseDialsReason: 'node -> control plane dials were not negotiated on this stream',
    // On an agent tunnel the server dials toward nodes and performs dials toward the control plane.
    onConnectionClosed: (c) => {
      opts.metrics?.connectionClosed(
        c.role === 'dialer' ? 'cp_to_node' : 'node_to_cp',
        c.bytesOut,
        c.bytesIn,
        (Date.now() - c.openedAt) / 1000,
      );
      opts.auditor?.connectionEnded(c, party);
      opts.onConnectionClosed?.(c);
    },
    onInboundDialFailed: (f) => opts.auditor?.inboundDialFailed('performer', party, f),
    onLimit: (limit, reason) => {
      const kind = countTunnelLimit(opts.metrics, limit, reason);
      if (kind) tunnel.recent.add(kind);
    },
    refusalReasons: AGENT_TUNNEL_REFUSALS,
    limitFlags: AGENT_TUNNEL_LIMIT_FLAGS,
    ...(resume ? { resumeTimeoutMs: resume.timeoutMs, onReplayed: (n: number) => resume.metrics.replayedBytes.inc(n) } : {}),
    ...(account ? { accounts: account } : {}),
    onPeerFault: (reason) => {
      opts.metrics?.refusals.inc({ reason });
      opts.metrics?.recent.add(reason);
      tunnel.recent.add(reason);
    },
  });
  if (account) tunnel.once('close', () => account.unuse());
  return tunnel;
}
