/** --target local_port:dst_host:dst_port (IPv6 hosts in brackets). */
import { AddressError, formatHostPort, parseHostPort, parsePort } from '../common/host-port.js';

export interface Target {
  localPort: number;
  /** host:port dialled by the server. */
  destination: string;
}

export function parseTarget(text: string): Target {
  const colon = text.indexOf(':');
  if (colon <= 0) throw new AddressError(`${JSON.stringify(text)}: expected local_port:dst_host:dst_port`);
  const localPort = parsePort(text.slice(0, colon), `${JSON.stringify(text)}: local port`);
  const destination = formatHostPort(parseHostPort(text.slice(colon + 1)));
  return { localPort, destination };
}
