/**
 * The agentIdentifiers metadata: a URL query such as
 * "host=node-1&ipv4=10.0.0.5&cidr=10.0.0.0/24&default-route=true".
 */
export interface AgentIdentifiers {
  hosts: string[];
  ipv4: string[];
  ipv6: string[];
  cidrs: string[];
  defaultRoute: boolean;
}

export const IDENTIFIER_KEYS = ['host', 'ipv4', 'ipv6', 'cidr', 'default-route'] as const;

export function parseAgentIdentifiers(text: string): AgentIdentifiers {
  const q = new URLSearchParams(text);
  for (const key of q.keys()) {
    if (!(IDENTIFIER_KEYS as readonly string[]).includes(key)) {
      throw new Error(`unknown agent identifier ${JSON.stringify(key)} (known: ${IDENTIFIER_KEYS.join(', ')})`);
    }
  }
  return {
    hosts: q.getAll('host'),
    ipv4: q.getAll('ipv4'),
    ipv6: q.getAll('ipv6'),
    cidrs: q.getAll('cidr'),
    defaultRoute: q.getAll('default-route').includes('true'),
  };
}
