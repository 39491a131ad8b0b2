/**
 * gRPC metadata keys of the Konnectivity protocol. gRPC lower-cases metadata
 * keys on the wire, so upstream's "agentID" travels as "agentid".
 */
export const MD_AGENT_ID = 'agentid';
export const MD_AGENT_IDENTIFIERS = 'agentidentifiers';
export const MD_AUTHORIZATION = 'authorization';
export const MD_SERVER_ID = 'serverid';
export const MD_SERVER_COUNT = 'servercount';
/** Kanal extension: comma-separated feature names (see features.ts). */
export const MD_KANAL_FEATURES = 'kanal-features';
/** Kanal extension (resume), server -> agent: the secret that names this tunnel for a later resume. */
export const MD_KANAL_RESUME_TOKEN = 'kanal-resume-token';
/** Kanal extension (resume), agent -> server: comma-separated tokens of the agent's detached tunnels. */
export const MD_KANAL_RESUME = 'kanal-resume';
/**
 * Kanal extension (resume), agent -> server: random per agent process. A new
 * stream of the same credential and agentID with another one means the
 * process that held the detached tunnels is gone.
 */
export const MD_KANAL_INCARNATION = 'kanal-incarnation';
/** Kanal extension (resume), server -> agent: the token of the detached tunnel this stream now carries. */
export const MD_KANAL_RESUMED = 'kanal-resumed';
/**
 * Kanal extension (node dials), agent -> server: comma-separated
 * destinations of the agent's --target listeners, so the server can say
 * which its allow-list refuses before a node connection finds out.
 */
export const MD_KANAL_TARGETS = 'kanal-targets';
/** Kanal extension (node dials), server -> agent: the destinations named in kanal-targets that its allow-list refuses. */
export const MD_KANAL_REFUSED_TARGETS = 'kanal-refused-targets';
/** Destinations an agent names at most (its --target count), each at most this long: the server reads no more. */
export const MAX_TARGETS_NAMED = 64;
export const MAX_TARGET_CHARS = 300;

export const AGENT_SERVICE_CONNECT = '/AgentService/Connect';
export const PROXY_SERVICE_PROXY = '/ProxyService/Proxy';

/** Flat, lower-cased view of gRPC metadata: every key maps to its values. */
export type MetadataMap = ReadonlyMap<string, readonly string[]>;

export function firstValue(md: MetadataMap, key: string): string | undefined {
  return md.get(key)?.[0];
}
