/**
 * One tunnel from this agent to one proxy server: open the Connect stream
 * with our metadata, read the server's identity and features from its
 * response headers, and put a Tunnel on it.
 */
import type { Logger } from 'pino';
import type { ClientTlsOptions, Transport } from '../transport/transport.js';
import {
  AGENT_SERVICE_CONNECT,
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
  MD_SERVER_COUNT,
  MD_SERVER_ID,
  firstValue,
} from '../wire/metadata.js';
import { Feature, formatFeatures, parseFeatures, intersectFeatures, type FeatureSet } from '../wire/features.js';
import { Tunnel, type DialHandler, type TunnelOptions } from '../tunnel/tunnel.js';
import type { InboundDialFailure } from '../tunnel/tunnel-options.js';
import type { TunnelLimits } from '../tunnel/limits.js';
import type { DialAllowance } from '../tunnel/dial-allowance.js';
import type { TunnelConnection } from '../tunnel/connection.js';
import type { ResolveHandler } from '../tunnel/name-resolution.js';

export interface ServerConnectionOptions {
  target: string;
  tls: ClientTlsOptions;
  agentID: string;
  agentIdentifiers: string;
  /** Bearer token for servers that authenticate agents by token. */
  token?: () => string | undefined;
  features: FeatureSet;
  /** The destinations of the --target listeners, named to a server that takes node dials (it answers which it refuses). */
  targets?: readonly string[];
  transport: Transport;
  dialHandler: DialHandler;
  /** Resolves the names the server asks for (with the resolve feature). */
  resolveHandler?: ResolveHandler;
  limits?: Partial<TunnelLimits>;
  /** The dial rates and counts shared by every tunnel to the server `serverID` (a reconnect starts with what the last left); absent: the tunnel's own. */
  allowance?: (serverID: string) => DialAllowance;
  connectTimeoutMs: number;
  log: Logger;
  /** The tunnel's connections as they close, with the server's ID. */
  onConnectionClosed?: (conn: TunnelConnection, serverID: string) => void;
  /** The server's dials this agent did not connect, with the server's ID. */
  onInboundDialFailed?: (failure: InboundDialFailure, serverID: string) => void;
  onLimit?: TunnelOptions['onLimit'];
  limitFlags?: TunnelOptions['limitFlags'];
  refusalReasons?: TunnelOptions['refusalReasons'];
  onPeerFault?: TunnelOptions['onPeerFault'];
  /**
   * Resume (docs/protocol.md): the detached tunnels this agent holds, by the
   * token their server gave; all are named on the new stream, and the one the
   * server answers with `kanal-resumed` is put on it instead of a new tunnel.
   */
  resume?: {
    timeoutMs: number;
    /** This agent process (MD_KANAL_INCARNATION). */
    incarnation: string;
    held(): ReadonlyMap<string, Tunnel>;
    onReplayed?: (bytes: number) => void;
  };
}

export interface ServerConnection {
  serverID: string;
  serverCount: number;
  tunnel: Tunnel;
  /** The server's token for this tunnel (resume negotiated), and whether this stream resumed a tunnel held already. */
  resumeToken?: string;
  resumed: boolean;
  /** Tokens named on the stream that the server did not resume. */
  notResumed: readonly string[];
  /** The named targets the server's allow-list refuses (a Kanal server says; others say nothing). */
  refusedTargets: readonly string[];
  close(): void;
  /** Resolves once the underlying stream is finished (after close(): when the server has seen our end). */
  readonly finished: Promise<void>;
}

export async function connectToServer(opts: ServerConnectionOptions): Promise<ServerConnection> {
  const channel = opts.transport.createChannel({ target: opts.target, tls: opts.tls });
  const metadata: Record<string, string> = {
    [MD_AGENT_ID]: opts.agentID,
    [MD_KANAL_FEATURES]: formatFeatures(opts.features),
  };
  if (opts.agentIdentifiers) metadata[MD_AGENT_IDENTIFIERS] = opts.agentIdentifiers;
  const token = opts.token?.();
  if (token) metadata[MD_AUTHORIZATION] = `Bearer ${token}`;
  const asked = opts.resume ? [...opts.resume.held().keys()] : [];
  if (asked.length > 0) metadata[MD_KANAL_RESUME] = asked.join(',');
  if (opts.resume) metadata[MD_KANAL_INCARNATION] = opts.resume.incarnation;
  if (opts.targets?.length && opts.features.has(Feature.NodeDial)) metadata[MD_KANAL_TARGETS] = opts.targets.join(',');
  let stream;
  try {
    stream = await channel.openStream(AGENT_SERVICE_CONNECT, metadata, opts.connectTimeoutMs);
  } catch (err) {
    channel.close();
    throw err;
  }
  const serverIDs = stream.metadata.get(MD_SERVER_ID) ?? [];
  const serverID = serverIDs.length === 1 && serverIDs[0] ? serverIDs[0] : '';
  const serverCount = Number(firstValue(stream.metadata, MD_SERVER_COUNT) ?? '1');
  if (!serverID) {
    stream.destroy();
    channel.close();
    throw new Error(`server did not send exactly one serverID header (got ${serverIDs.length})`);
  }
  // A server that does not answer with kanal-features is upstream Konnectivity.
  const features = intersectFeatures(parseFeatures(firstValue(stream.metadata, MD_KANAL_FEATURES)), opts.features);
  const resume = features.has(Feature.Resume) ? opts.resume : undefined;
  const resumeToken = resume && firstValue(stream.metadata, MD_KANAL_RESUME_TOKEN);
  const resumedToken = resume && firstValue(stream.metadata, MD_KANAL_RESUMED);
  const held = resumedToken ? resume.held().get(resumedToken) : undefined;
  const resumed = held !== undefined && formatFeatures(held.features) === formatFeatures(features) && held.reattach(stream);
  if (resumedToken && !resumed) {
    // The server put a tunnel on this stream that we no longer hold: a fresh one here would never match it.
    stream.destroy();
    channel.close();
    throw new Error('the server resumed a tunnel this agent no longer holds; reconnecting');
  }
  const { onConnectionClosed: onClosed, onInboundDialFailed: onDialFailed } = opts;
  const tunnel = resumed
    ? held
    : new Tunnel(stream, {
        side: 'agent',
        features,
        log: opts.log.child({ serverID }),
        limits: opts.limits,
        ...(opts.allowance ? { allowance: opts.allowance(serverID) } : {}),
        dialHandler: opts.dialHandler,
        ...(opts.resolveHandler ? { resolveHandler: opts.resolveHandler } : {}),
        ...(onClosed ? { onConnectionClosed: (c: TunnelConnection) => onClosed(c, serverID) } : {}),
        ...(onDialFailed ? { onInboundDialFailed: (f: InboundDialFailure) => onDialFailed(f, serverID) } : {}),
        onLimit: opts.onLimit,
        limitFlags: opts.limitFlags,
        refusalReasons: opts.refusalReasons,
        onPeerFault: opts.onPeerFault,
        ...(resume && resumeToken ? { resumeTimeoutMs: resume.timeoutMs, onReplayed: resume.onReplayed } : {}),
      });
  // The channel carries this stream only: it closes when the stream is lost (the tunnel may live on) or the tunnel closes.
  const streamDone = (): void => {
    tunnel.off('detached', streamDone).off('close', streamDone);
    channel.close();
  };
  tunnel.on('detached', streamDone).on('close', streamDone);
  const finished = stream.closed ? Promise.resolve() : new Promise<void>((resolve) => stream.once('close', () => resolve()));
  return {
    serverID,
    serverCount: Number.isInteger(serverCount) && serverCount > 0 ? serverCount : 1,
    tunnel,
    ...(resumeToken ? { resumeToken } : {}),
    resumed,
    notResumed: asked.filter((t) => t !== resumedToken || !resumed),
    // Only what we named: a server cannot make the agent report anything else.
    refusedTargets: (firstValue(stream.metadata, MD_KANAL_REFUSED_TARGETS) ?? '')
      .split(',', MAX_TARGETS_NAMED)
      .filter((t) => opts.targets?.includes(t)),
    close: () => tunnel.close(),
    finished,
  };
}
