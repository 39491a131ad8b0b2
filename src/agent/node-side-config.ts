/**
 * The node -> control plane side's configuration (KEP-2025): which advertise
 * address the agent serves, on which interface, and which --target ports it
 * forwards. Checked here, beside what uses it (assembled-agent.ts); errors
 * name the flag to fix.
 */
import { isIP } from 'node:net';
import { UsageError } from '../common/usage-error.js';
import { choiceFlag } from '../common/flag-values.js';
import { INTERFACE_TYPES, type InterfaceType } from './host-interface-manager.js';
import { parseTarget, type Target } from './target.js';

/** Node -> control plane: serve `targets` on `bindAddress`, carried by a host-scoped interface. */
export interface NodeSideOptions {
  bindAddress: string;
  targets: Target[];
  interfaceName: string;
  interfaceType: InterfaceType;
  /** How long a node connection waits for a tunnel before it is closed. */
  tunnelWaitMs: number;
}

export interface NodeSideFlags {
  /** `--bind-address` */
  bindAddress: string | undefined;
  /** `--target`, each local_port:dst_host:dst_port */
  targets: readonly string[];
  /** `--bind-interface` */
  interfaceName: string;
  /** `--bind-interface-type` */
  interfaceType: string;
}

/**
 * The node side the flags ask for, without its tunnel wait (the caller's
 * duration flag); undefined when neither --bind-address nor --target is
 * given. Throws a UsageError naming the flag.
 */
export function nodeSideFromFlags(flags: NodeSideFlags): Omit<NodeSideOptions, 'tunnelWaitMs'> | undefined {
  const targets = flags.targets.map((t) => {
    try {
      return parseTarget(t);
    } catch (err) {
      throw new UsageError(`--target: ${(err as Error).message}`);
    }
  });
  const bind = flags.bindAddress;
  if (targets.length === 0 && !bind) return undefined;
  if (!bind) throw new UsageError('--target needs --bind-address (the kube-apiserver advertise address)');
  if (isIP(bind) === 0) throw new UsageError(`--bind-address ${JSON.stringify(bind)} is not an IP address`);
  if (targets.length === 0) throw new UsageError('--bind-address needs at least one --target local_port:dst_host:dst_port');
  const ports = new Set<number>();
  for (const t of targets) {
    if (ports.has(t.localPort)) throw new UsageError(`--target: local port ${t.localPort} is used twice`);
    ports.add(t.localPort);
  }
  const name = flags.interfaceName;
  if (!/^[A-Za-z0-9_.-]{1,15}$/.test(name)) throw new UsageError(`--bind-interface ${JSON.stringify(name)}: 1-15 letters, digits, '.', '_' or '-'`);
  const interfaceType = choiceFlag('bind-interface-type', flags.interfaceType, INTERFACE_TYPES);
  return { bindAddress: bind, targets, interfaceName: name, interfaceType };
}
