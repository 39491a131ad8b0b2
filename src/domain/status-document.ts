/**
 * The status document the admin port serves on STATUS_PATH (docs/operations.md,
 * "What is connected: `kanal status`"): what a server or an agent holds right
 * now, read from where it lives. Versioned: a field is added without a new
 * version; one renamed, removed or changed in meaning takes a new one. It
 * names identities (certificate subjects, service accounts), never a token,
 * key or resume token.
 */
import type { RecentCounts } from './recent-events.js';

export { STATUS_PATH } from '../common/admin-server.js';

/** Tunnel.snapshot(): what the admin port's /status shows of a tunnel. */
export interface TunnelSnapshot {
  state: 'open' | 'detached' | 'closing' | 'closed';
  /** The peer sent DRAIN: it asks for no new dials. */
  peerDraining: boolean;
  /** The transport's send buffer is full; bulk data waits. */
  writeBlocked: boolean;
  /** The tunnel does not read its stream now. */
  readPaused: boolean;
  /** While detached: how long ago the stream was lost. */
  detachedForMs?: number;
  /** Open connections this side asked for (dialer) and dialled for the peer (performer). */
  connections: { dialer: number; performer: number };
  /** Dials this side asked for awaiting DIAL_RSP (outbound), and the peer's being performed here (inbound). */
  pendingDials: { outbound: number; inbound: number };
  /** Bytes of the tunnel's connections, open and closed, sent to the peer and received from it. */
  bytes: { sent: number; received: number };
}

export const STATUS_KIND = 'kanal-status';
/** 2: a server's `agents` is one page of them (`page`). */
export const STATUS_VERSION = 2;

/** What every status document starts with. */
export interface StatusHeader {
  kind: typeof STATUS_KIND;
  version: typeof STATUS_VERSION;
  /** When it was made (ISO 8601). */
  generatedAt: string;
  /** Kanal's version and commit, the process and how long it has run. */
  process: { version: string; commit: string; pid: number; uptimeSeconds: number };
  /** Refusals and throttles of the whole process over the last 1, 5 and 15 minutes, by reason. */
  recent: RecentCounts;
}

/** Per direction: control plane -> node (the kube-apiserver reaches the node) and node -> control plane. */
export interface PerDirection {
  cpToNode: number;
  nodeToCp: number;
}

/** One tunnel's stream and what it carries, on either side. */
export interface TunnelStatus {
  /** open; detached (the stream was lost, its connections wait for a resume); closing. */
  state: 'open' | 'detached' | 'closing' | 'closed';
  /** When the tunnel was made (a resume keeps it) and its age. */
  since: string;
  ageSeconds: number;
  /** While detached: seconds since the stream was lost. */
  detachedSeconds?: number;
  /** Kanal features negotiated on it (none: an upstream peer). */
  features: string[];
  /** The peer asked for no new dials (DRAIN). */
  peerDraining: boolean;
  /** Not reading its stream now (a slow local reader, or a peer that does not read). */
  readPaused: boolean;
  connections: PerDirection;
  pendingDials: PerDirection;
  /** Bytes of its connections (open and closed), to the peer and from it. */
  bytes: { toPeer: number; fromPeer: number };
}

/** An agent tunnel as the server sees it. */
export interface AgentTunnelStatus extends TunnelStatus {
  /** The agent's address as the server sees it ('' while detached). */
  peer: string;
  /** HTTP/2 PING liveness of its connection: quiet once a PING goes unanswered for 2 s. */
  liveness?: { quiet: boolean; lastAnswerSecondsAgo?: number };
  /** Refusals and throttles of this tunnel over the last minutes. */
  recent: RecentCounts;
}

export interface AgentStatus {
  agentID: string;
  /** What authenticated it: a certificate's subject and issuer, or a service account (and pod), or the peer address when unauthenticated. */
  credential: string;
  /** Its tenant (--tenants-config). */
  tenant?: string;
  /** What it announced for routing (agentIdentifiers). */
  identifiers: { hosts: string[]; ipv4: string[]; ipv6: string[]; defaultRoute: boolean };
  tunnels: AgentTunnelStatus[];
}

export interface ServerStatusDocument extends StatusHeader {
  component: 'server';
  server: {
    serverID: string;
    serverCount: number;
    /** created, starting, listening, stopping, stopped. */
    state: string;
    /** Tenants served (--tenants-config); absent for a server of one cluster. */
    tenants?: string[];
  };
  /** One page of the agents that match `page.filter`, ordered by tenant, agentID and credential. */
  agents: AgentStatus[];
  page: StatusPage;
}

/**
 * Which agents a server's document shows: those matching `filter`, at most
 * `limit` (and a bounded number of bytes) after the cursor it was asked for.
 * `next`, when present, is the `after=` of the next page; the pages of one
 * walk never show an agent twice, and show every agent present throughout.
 */
export interface StatusPage {
  filter: { tenant?: string; agent?: string };
  limit: number;
  /** Agents matching the filter in the snapshot this page was cut from (at most a second old). */
  matched: number;
  next?: string;
}

/** A tunnel as the agent sees it. */
export interface ServerTunnelStatus extends TunnelStatus {
  serverID: string;
  /** The address it was opened through. */
  address: string;
}

/** An address the agent dials, and where its reconnect loop is. */
export interface ServerAddressStatus {
  /** What is dialled: the host as given, or one of its addresses. */
  address: string;
  /** The host as given (--proxy-server-host). */
  name: string;
  /**
   * connected: a tunnel is held through it; detached: its tunnel waits to resume;
   * reaches-held: it reached a server already held through another address;
   * backing-off: its last connect failed (lastError); connecting: otherwise.
   */
  state: 'connected' | 'detached' | 'reaches-held' | 'backing-off' | 'connecting';
  /** The servers held (or reached) through it. */
  serverIDs: string[];
  lastError?: string;
}

export interface AgentStatusDocument extends StatusHeader {
  component: 'agent';
  agent: {
    agentID: string;
    /** created, running, draining, stopped. */
    state: string;
    /** How many servers it aims to hold tunnels to, and why that many. */
    expectedServers: { count: number; from: string };
  };
  servers: ServerAddressStatus[];
  tunnels: ServerTunnelStatus[];
  /** Node -> control plane listeners (--target), when configured. */
  nodeListeners?: {
    bindAddress: string;
    targets: { listen: string; destination: string }[];
    /** False once it stopped accepting (draining). */
    listening: boolean;
    /** Accepted connections waiting for a tunnel, and carried now. */
    waiting: number;
    active: number;
  };
  /** The interface carrying the advertise address (--bind-interface-*), when configured. */
  hostInterface?: { name: string; type: string; address: string; ready: boolean; detail: string };
}

export type StatusDocument = ServerStatusDocument | AgentStatusDocument;

/** The header every document shares. */
export function statusHeader(build: { version: string; commit: string }, recent: RecentCounts, now = Date.now()): StatusHeader {
  return {
    kind: STATUS_KIND,
    version: STATUS_VERSION,
    generatedAt: new Date(now).toISOString(),
    process: { version: build.version, commit: build.commit, pid: process.pid, uptimeSeconds: Math.floor(process.uptime()) },
    recent,
  };
}

/** A tunnel snapshot in the document's words: `dialer` and `performer` become directions by the side's role. */
export function tunnelStatus(
  t: { createdAt: number; features: ReadonlySet<string>; snapshot(): TunnelSnapshot },
  side: 'server' | 'agent',
  now = Date.now(),
): TunnelStatus {
  const s = t.snapshot();
  // The server asks for control plane -> node connections and performs node -> control plane ones; the agent the reverse.
  const perDirection = (asked: number, performed: number): PerDirection =>
    side === 'server' ? { cpToNode: asked, nodeToCp: performed } : { cpToNode: performed, nodeToCp: asked };
  return {
    state: s.state,
    since: new Date(t.createdAt).toISOString(),
    ageSeconds: Math.max(0, Math.floor((now - t.createdAt) / 1000)),
    ...(s.detachedForMs !== undefined ? { detachedSeconds: Math.floor(s.detachedForMs / 1000) } : {}),
    features: [...t.features].sort(),
    peerDraining: s.peerDraining,
    readPaused: s.readPaused,
    connections: perDirection(s.connections.dialer, s.connections.performer),
    pendingDials: perDirection(s.pendingDials.outbound, s.pendingDials.inbound),
    bytes: { toPeer: s.bytes.sent, fromPeer: s.bytes.received },
  };
}
