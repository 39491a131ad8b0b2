/**
 * The node -> control plane side's configuration (KEP-2025): which advertise
 * address the agent serves, on which interface, and which --target ports it
 * forwards. Each setting is checked by its entry (settings.ts); what ties
 * them together is checked here, beside what uses it (agent.ts).
 */
import { UsageError } from '../common/usage-error.js';
import type { InterfaceType } from './host-interface-manager.js';
import type { Target } from './target.js';
import { FLAG } from './settings.js';

/** Node -> control plane: serve `targets` on `bindAddress`, carried by a host-scoped interface. */
export interface NodeSideOptions {
  bindAddress: string;
  targets: Target[];
  interfaceName: string;
  interfaceType: InterfaceType;
  /** How long a node connection waits for a tunnel before it is closed. */
  tunnelWaitMs: number;
}

/**
 * The node side the settings ask for, without its tunnel wait; undefined
 * when neither --bind-address nor --target is given. Throws a UsageError
 * naming the flag.
 */
export function nodeSideFromSettings(
  s: Omit<NodeSideOptions, 'tunnelWaitMs' | 'bindAddress'> & { bindAddress: string | undefined },
): Omit<NodeSideOptions, 'tunnelWaitMs'> | undefined {
  const { targets, interfaceName: name, interfaceType } = s;
  const bind = s.bindAddress;
  if (targets.length === 0 && !bind) return undefined;
  if (!bind) throw new UsageError(`--target needs ${FLAG['bind-address']} (the kube-apiserver advertise address)`);
  if (targets.length === 0) throw new UsageError(`${FLAG['bind-address']} needs at least one --target local_port:dst_host:dst_port`);
  const ports = new Set<number>();
  for (const t of targets) {
    if (ports.has(t.localPort)) throw new UsageError(`--target: local port ${t.localPort} is used twice`);
    ports.add(t.localPort);
  }
  return { bindAddress: bind, targets, interfaceName: name, interfaceType };
}
