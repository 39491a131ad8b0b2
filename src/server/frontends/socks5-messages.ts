/**
 * The client's side of a SOCKS5 head, parsed incrementally: the greeting
 * (RFC 1928 section 3), the username/password sub-negotiation (RFC 1929
 * section 2) and the request (RFC 1928 section 4). Each parser looks at the
 * bytes received so far, from the start of its message, and says 'more'
 * (wait: the head deadline bounds the wait), 'bad' (answer `reply` and close)
 * or 'done' (the message and how many bytes it took). Nothing is copied until
 * a message is complete, and no message can be longer than its fields allow
 * (a greeting 257 bytes, a sub-negotiation 513, a request 262).
 */
import net from 'node:net';
import { formatHostPort, isValidHost } from '../../common/host-port.js';
import { SOCKS_AUTH_FAILURE, SOCKS_NO_ACCEPTABLE_METHOD, socksReply, SocksRep } from './socks5-reply-codes.js';

export const SOCKS_VERSION = 0x05;
/** RFC 1929 section 2: the sub-negotiation's own version. */
export const USERPASS_VERSION = 0x01;

/** RFC 1928 section 3: the methods Kanal knows. */
export const SocksMethod = { noAuth: 0x00, userPass: 0x02 } as const;

/** RFC 1928 section 4: CMD. */
export const SocksCommand = { connect: 0x01, bind: 0x02, udpAssociate: 0x03 } as const;

/** RFC 1928 section 4/5: ATYP. */
export const SocksAddressType = { ipv4: 0x01, domain: 0x03, ipv6: 0x04 } as const;

/** Why a head was refused: the log's `detail`, and which refusal reason it counts as. */
export type SocksBadCode =
  | 'greeting_version'
  | 'greeting_no_methods'
  | 'auth_version'
  | 'request_version'
  | 'request_reserved'
  | 'request_command'
  | 'request_address_type'
  | 'request_domain_length'
  | 'request_domain'
  | 'request_port'
  | 'head_too_large';

export type SocksParse<T> =
  | { readonly kind: 'more' }
  | { readonly kind: 'bad'; readonly code: SocksBadCode; readonly message: string; readonly reply: Buffer }
  | { readonly kind: 'done'; readonly value: T; readonly used: number };

const MORE = { kind: 'more' } as const;

export interface SocksGreeting {
  /** The methods offered (RFC 1928: 1 to 255 of them). */
  readonly methods: ReadonlySet<number>;
}

export interface SocksUserPass {
  /** Informational only: it is logged, the password is the credential. */
  readonly username: string;
  /** The bearer token (ClientCredentials.token); empty: none. */
  readonly password: string;
}

export interface SocksRequest {
  /** "host:port" as the clients' dial() takes it; a domain name stays a name (socks5h: resolved in the cluster). */
  readonly address: string;
  readonly addressType: 'ipv4' | 'domain' | 'ipv6';
}

function bad<T>(code: SocksBadCode, message: string, reply: Buffer): SocksParse<T> {
  return { kind: 'bad', code, message, reply };
}

/** RFC 1928 section 3: VER, NMETHODS, METHODS. A version other than 5 or no method: "no acceptable methods", then closed. */
export function parseGreeting(b: Buffer): SocksParse<SocksGreeting> {
  if (b.length < 1) return MORE;
  if (b[0] !== SOCKS_VERSION) return bad('greeting_version', `SOCKS version ${b[0]} is not 5`, SOCKS_NO_ACCEPTABLE_METHOD);
  if (b.length < 2) return MORE;
  const n = b[1];
  if (n === 0) return bad('greeting_no_methods', 'greeting offers no method', SOCKS_NO_ACCEPTABLE_METHOD);
  if (b.length < 2 + n) return MORE;
  return { kind: 'done', value: { methods: new Set(b.subarray(2, 2 + n)) }, used: 2 + n };
}

/**
 * RFC 1929 section 2: VER 1, ULEN, UNAME, PLEN, PASSWD. The RFC gives both
 * 1 to 255 bytes; an empty one is taken (curl sends `-U :token` so), an empty
 * password is no token, and admission decides.
 */
export function parseUserPass(b: Buffer): SocksParse<SocksUserPass> {
  if (b.length < 1) return MORE;
  if (b[0] !== USERPASS_VERSION) return bad('auth_version', `username/password version ${b[0]} is not 1`, SOCKS_AUTH_FAILURE);
  if (b.length < 2) return MORE;
  const ulen = b[1];
  if (b.length < 3 + ulen) return MORE;
  const plen = b[2 + ulen];
  const end = 3 + ulen + plen;
  if (b.length < end) return MORE;
  return {
    kind: 'done',
    value: { username: b.toString('utf8', 2, 2 + ulen), password: b.toString('utf8', 3 + ulen, end) },
    used: end,
  };
}

/**
 * RFC 1928 section 4: VER 5, CMD, RSV 0, ATYP, DST.ADDR, DST.PORT. Only
 * CONNECT is served (BIND and UDP ASSOCIATE: reply 7); an unknown ATYP has no
 * length to skip (reply 8). A domain name must be a host name (or an IP
 * literal some clients send as a name): its bytes reach logs and the dial.
 */
export function parseRequest(b: Buffer): SocksParse<SocksRequest> {
  if (b.length < 1) return MORE;
  if (b[0] !== SOCKS_VERSION) return bad('request_version', `request version ${b[0]} is not 5`, socksReply(SocksRep.generalFailure));
  if (b.length < 2) return MORE;
  const cmd = b[1];
  if (cmd !== SocksCommand.connect)
    return bad('request_command', `command ${cmd} is not CONNECT (1)`, socksReply(SocksRep.commandNotSupported));
  if (b.length < 3) return MORE;
  if (b[2] !== 0) return bad('request_reserved', `reserved byte is ${b[2]}, not 0`, socksReply(SocksRep.generalFailure));
  if (b.length < 4) return MORE;
  const atyp = b[3];
  let host: string;
  let at: number;
  let addressType: SocksRequest['addressType'];
  if (atyp === SocksAddressType.ipv4) {
    if (b.length < 4 + 4 + 2) return MORE;
    host = `${b[4]}.${b[5]}.${b[6]}.${b[7]}`;
    at = 8;
    addressType = 'ipv4';
  } else if (atyp === SocksAddressType.ipv6) {
    if (b.length < 4 + 16 + 2) return MORE;
    const groups: string[] = [];
    for (let i = 0; i < 16; i += 2) groups.push(b.readUInt16BE(4 + i).toString(16));
    // Through net's parser for the canonical text ("::1", not "0:0:0:0:0:0:0:1").
    host = new net.SocketAddress({ address: groups.join(':'), family: 'ipv6' }).address;
    at = 20;
    addressType = 'ipv6';
  } else if (atyp === SocksAddressType.domain) {
    if (b.length < 5) return MORE;
    const len = b[4];
    if (len === 0) return bad('request_domain_length', 'domain name is empty', socksReply(SocksRep.generalFailure));
    if (b.length < 5 + len + 2) return MORE;
    host = b.toString('latin1', 5, 5 + len);
    if (!isValidHost(host)) return bad('request_domain', 'domain name is not a valid host name', socksReply(SocksRep.hostUnreachable));
    at = 5 + len;
    addressType = 'domain';
  } else {
    return bad('request_address_type', `address type ${atyp} is not 1, 3 or 4`, socksReply(SocksRep.addressTypeNotSupported));
  }
  const port = b.readUInt16BE(at);
  if (port === 0) return bad('request_port', 'port 0', socksReply(SocksRep.generalFailure));
  return { kind: 'done', value: { address: formatHostPort({ host, port }), addressType }, used: at + 2 };
}
