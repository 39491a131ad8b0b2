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

export const AGENT_SERVICE_CONNECT = '/AgentService/Connect';
export const PROXY_SERVICE_PROXY = '/ProxyService/Proxy';

/** Flat, lower-cased view of gRPC metadata: every key maps to its values. */
export type MetadataMap = ReadonlyMap<string, readonly string[]>;

export function firstValue(md: MetadataMap, key: string): string | undefined {
  return md.get(key)?.[0];
}
