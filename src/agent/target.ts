/** --target local_port:dst_host:dst_port (IPv6 hosts in brackets). */
import { AddressError, formatHostPort, parseHostPort, parsePort } from '../common/host-port.js';

export interface Target {
  localPort: number;
  /** host:port dialled by the server. */
  destination: string;
}

/** A server's allow-list refuses `t`'s destination: the two flags to change, the agent's and the server's. */
export function refusedTargetMessage(t: Target, serverID: string): string {
  return (
    `server ${serverID} refuses --target ${t.localPort}:${t.destination}: ${t.destination} is not on its allow-list; ` +
    `add --allowed-destination ${t.destination} to the server (with --tenants-config: to the tenant's allowed-destination)`
  );
}

export function parseTarget(text: string): Target {
  const colon = text.indexOf(':');
  if (colon <= 0) throw new AddressError(`${JSON.stringify(text)}: expected local_port:dst_host:dst_port`);
  const localPort = parsePort(text.slice(0, colon), `${JSON.stringify(text)}: local port`);
  const destination = formatHostPort(parseHostPort(text.slice(colon + 1)));
  return { localPort, destination };
}
