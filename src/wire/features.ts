/**
 * Kanal protocol extensions, negotiated per stream. The initiator of a stream
 * lists what it supports in the "kanal-features" request metadata; the
 * acceptor answers with the subset it will use in its response headers. A
 * peer that sends nothing (upstream agents, servers, the KAS) gets plain
 * Konnectivity.
 */
export enum Feature {
  /** Per-connection credit flow control (KANAL_WINDOW packets). */
  Window = 'window',
  /** TCP half-close (KANAL_HALF_CLOSE packets). */
  HalfClose = 'half-close',
  /** Agent-initiated dials to the server (node -> control plane, KEP-2025). */
  NodeDial = 'node-dial',
  /**
   * Connections outlive a lost stream: both sides keep them detached and
   * resume them on the agent's next stream to the same server (docs/protocol.md).
   * Used only together with Window and HalfClose.
   */
  Resume = 'resume',
  /**
   * Names resolved by the peer, inside its cluster (KANAL_RESOLVE_REQ /
   * KANAL_RESOLVE_RSP): the server asks, the agent answers with its resolver
   * (docs/protocol.md, "Resolve").
   */
  Resolve = 'resolve',
}

export type FeatureSet = ReadonlySet<Feature>;

export const NO_FEATURES: FeatureSet = new Set();
export const ALL_FEATURES: FeatureSet = new Set(Object.values(Feature));

export function parseFeatures(header: string | undefined): FeatureSet {
  const known = new Set<string>(Object.values(Feature));
  const out = new Set<Feature>();
  for (const part of (header ?? '').split(',')) {
    const name = part.trim();
    if (known.has(name)) out.add(name as Feature);
  }
  return out;
}

export function formatFeatures(features: FeatureSet): string {
  return [...features].sort().join(',');
}

export function intersectFeatures(a: FeatureSet, b: FeatureSet): FeatureSet {
  return new Set([...a].filter((f) => b.has(f)));
}
