/**
 * Which Node.js runs Kanal. Kept free of imports so that the entry can check
 * the runtime before any dependency loads: undici 8 (under client-node 2)
 * throws while loading on Node 20 (docs/upgrading.md, "Runtime").
 */

/** The oldest release of each line Kanal runs on; a line not listed is below the first. */
export const SUPPORTED_NODE = '22.19';
const MINIMUM: readonly [number, number] = [22, 19];

/** Why this Node.js cannot run Kanal, or undefined when it can. `version` is `process.versions.node`. */
export function runtimeProblem(version: string): string | undefined {
  const [major = NaN, minor = NaN] = version.split('.').map(Number);
  if (major > MINIMUM[0] || (major === MINIMUM[0] && minor >= MINIMUM[1])) return undefined;
  return (
    `Node.js ${version} cannot run Kanal: it needs Node.js ${SUPPORTED_NODE} or later, on a maintained LTS line (22, 24 or 26; 26 is tested). ` +
    'Install a supported Node.js, or use the kanal executable (npm run package), which brings its own runtime.'
  );
}

/**
 * A known defect of this runtime that an operator should hear about at start,
 * or undefined. Node 24's OpenSSL 3.5 keeps every client certificate a TLS
 * server receives (docs/memory.md, "Connection churn").
 */
export function runtimeWarning(version: string, role: 'server' | 'agent'): string | undefined {
  if (role !== 'server' || !version.startsWith('24.')) return undefined;
  return `Node.js ${version} keeps about 2.7 KiB of memory per client certificate a TLS server receives (docs/memory.md, "Connection churn"): run kanal server on Node.js 26 or 22`;
}
