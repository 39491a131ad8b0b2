/** `--check`: the kernel side of the node -> control plane half (netlink, capabilities, binding the advertise address). */
import fs from 'node:fs';
import { checkNetlink } from '../../native/host-interface.js';
import { bindProblem, describeBindProblem } from './bind-probe.js';

import type { CheckResult, PreflightOptions } from './preflight-options.js';
import { agentSettings, FLAG } from './settings.js';
import { keyOf } from '../settings/flag-names.js';

const CAP_NET_BIND_SERVICE = 10;
const CAP_NET_ADMIN = 12;

/** Whether capability `bit` is in this process's effective set; undefined if unknown. */
export function hasCapability(bit: number): boolean | undefined {
  try {
    const m = /^CapEff:\s*([0-9a-f]+)$/m.exec(fs.readFileSync('/proc/self/status', 'utf8'));
    if (!m) return undefined;
    return (BigInt(`0x${m[1]}`) & (1n << BigInt(bit))) !== 0n;
  } catch {
    return undefined;
  }
}

export function unprivilegedPortStart(): number {
  try {
    return Number(fs.readFileSync('/proc/sys/net/ipv4/ip_unprivileged_port_start', 'utf8').trim());
  } catch {
    return 1024;
  }
}

export async function kernelChecks(opts: PreflightOptions): Promise<CheckResult[]> {
  const results: CheckResult[] = [];
  const node = opts.node;
  const probe = opts.netlink ?? (() => checkNetlink());
  const nl = probe();
  if (nl.ok) results.push({ name: 'netlink', status: 'pass', detail: nl.detail });
  else
    results.push({
      name: 'netlink',
      status: node ? 'fail' : 'warn',
      detail: node ? nl.detail : `${nl.detail} (not needed without ${FLAG['bind-address']})`,
    });

  if (!node) {
    results.push({ name: 'CAP_NET_ADMIN', status: 'skip', detail: `not needed without ${FLAG['bind-address']}` });
  } else if (node.interfaceType === 'none') {
    results.push({ name: 'CAP_NET_ADMIN', status: 'skip', detail: `not needed with ${FLAG['bind-interface-type']} none` });
    // The agent only needs to listen there: 127.0.0.2 is on no interface, yet usable through lo (docs/operations.md).
    const problem = await bindProblem(node.bindAddress);
    results.push(
      problem
        ? { name: keyOf(agentSettings, 'bind-address'), status: 'fail', detail: describeBindProblem(node.bindAddress, problem) }
        : { name: keyOf(agentSettings, 'bind-address'), status: 'pass', detail: `${node.bindAddress} can be listened on` },
    );
  } else {
    const cap = hasCapability(CAP_NET_ADMIN);
    results.push(
      cap === false
        ? {
            name: 'CAP_NET_ADMIN',
            status: 'fail',
            detail: `missing: the agent cannot create ${node.interfaceType} interface for ${node.bindAddress} (run as root, or grant CAP_NET_ADMIN: AmbientCapabilities= in the unit, capabilities.add: [NET_ADMIN] in a pod)`,
          }
        : {
            name: 'CAP_NET_ADMIN',
            status: cap ? 'pass' : 'warn',
            detail: cap ? 'present (needed to create the host-scoped interface)' : 'cannot tell (no /proc/self/status)',
          },
    );
  }

  const lowPorts = [...(node?.targets.map((t) => t.localPort) ?? []), ...(opts.healthPort ? [opts.healthPort] : [])].filter(
    (p) => p > 0 && p < unprivilegedPortStart(),
  );
  if (lowPorts.length > 0) {
    const cap = hasCapability(CAP_NET_BIND_SERVICE);
    results.push(
      cap === false
        ? { name: 'CAP_NET_BIND_SERVICE', status: 'fail', detail: `missing: port(s) ${lowPorts.join(', ')} are privileged on this host` }
        : {
            name: 'CAP_NET_BIND_SERVICE',
            status: cap ? 'pass' : 'warn',
            detail: `${cap ? 'present' : 'cannot tell'} (port(s) ${lowPorts.join(', ')} are privileged)`,
          },
    );
  }
  return results;
}
