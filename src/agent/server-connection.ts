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
  MD_SERVER_COUNT,
  MD_SERVER_ID,
  firstValue,
} from '../wire/metadata.js';
import { formatFeatures, parseFeatures, intersectFeatures, type FeatureSet } from '../wire/features.js';
import { Tunnel, type DialHandler, type TunnelOptions } from '../tunnel/tunnel.js';
import type { TunnelLimits } from '../tunnel/limits.js';
import type { TunnelConnection } from '../tunnel/connection.js';

export interface ServerConnectionOptions {
  target: string;
  tls: ClientTlsOptions;
  agentID: string;
  agentIdentifiers: string;
  /** Bearer token for servers that authenticate agents by token. */
  token?: () => string | undefined;
  features: FeatureSet;
  transport: Transport;
  dialHandler: DialHandler;
  limits?: Partial<TunnelLimits>;
  connectTimeoutMs: number;
  log: Logger;
  onConnectionClosed?: (conn: TunnelConnection) => void;
  onLimit?: TunnelOptions['onLimit'];
  limitFlags?: TunnelOptions['limitFlags'];
}

export interface ServerConnection {
  serverID: string;
  serverCount: number;
  tunnel: Tunnel;
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
  const log = opts.log.child({ serverID });
  const tunnel = new Tunnel(stream, {
    side: 'agent',
    features,
    log,
    limits: opts.limits,
    dialHandler: opts.dialHandler,
    onConnectionClosed: opts.onConnectionClosed,
    onLimit: opts.onLimit,
    limitFlags: opts.limitFlags,
  });
  tunnel.once('close', () => channel.close());
  const finished = stream.closed ? Promise.resolve() : new Promise<void>((resolve) => stream.once('close', () => resolve()));
  return {
    serverID,
    serverCount: Number.isInteger(serverCount) && serverCount > 0 ? serverCount : 1,
    tunnel,
    close: () => tunnel.close(),
    finished,
  };
}
