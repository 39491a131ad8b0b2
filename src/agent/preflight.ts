/**
 * `kanal agent --check`: everything the agent needs before it can carry
 * traffic, checked one by one and reported as a pass/fail list, without
 * changing anything on the node. Checks that depend on an earlier failure
 * are skipped with the reason, so the first real cause stands out.
 *
 *   ca-cert, agent-cert, agent-key, token   readable, parse, currently valid, cert/key match
 *   server-tls                              TLS handshake with the agent credentials, ALPN h2
 *   server-accepts-agent                    the AgentService/Connect stream is accepted
 *   node-dial, target <port>                KEP-2025 negotiated; each --target destination dials
 *   netlink, CAP_NET_ADMIN, ...             the kernel side of the host-scoped interface
 */
import fs from 'node:fs';
import os from 'node:os';
import tls from 'node:tls';
import { isIP } from 'node:net';
import { X509Certificate, createPrivateKey, type KeyObject } from 'node:crypto';
import type { Logger } from 'pino';
import type { Transport } from '../transport/transport.js';
import { Feature, formatFeatures, type FeatureSet } from '../wire/features.js';
import { DialError } from '../tunnel/errors.js';
import { formatHostPort } from '../common/host-port.js';
import { checkNetlink } from '../../native/host-interface.js';
import { connectToServer } from './server-connection.js';
import type { Target } from './target.js';
import type { InterfaceType } from './host-interface-manager.js';

export type CheckStatus = 'pass' | 'fail' | 'warn' | 'skip';

export interface CheckResult {
  name: string;
  status: CheckStatus;
  detail: string;
}

export interface PreflightOptions {
  agentID: string;
  agentIdentifiers: string;
  server: { host: string; port: number; caFile?: string; certFile?: string; keyFile?: string; serverName?: string };
  tokenFile?: string;
  connectTimeoutMs: number;
  dialTimeoutMs: number;
  node?: { bindAddress: string; targets: readonly Target[]; interfaceType: InterfaceType };
  healthPort?: number;
  transport: Transport;
  /** Logger for the tunnel code; --check passes a silent one. */
  log: Logger;
  /** Replaceable for tests; defaults to the real rtnetlink probe. */
  netlink?: () => { ok: boolean; detail: string };
}

const CAP_NET_BIND_SERVICE = 10;
const CAP_NET_ADMIN = 12;
const OID_CLIENT_AUTH = '1.3.6.1.5.5.7.3.2';
const OID_ANY_EKU = '2.5.29.37.0';
const AGENT_FEATURES: FeatureSet = new Set([Feature.Window, Feature.HalfClose, Feature.NodeDial]);

// ---------------------------------------------------------------- credentials

function readable(path: string): { data: Buffer } | { error: string } {
  try {
    return { data: fs.readFileSync(path) };
  } catch (err) {
    const e = err as NodeJS.ErrnoException;
    const why =
      e.code === 'ENOENT' ? 'no such file' : e.code === 'EACCES' ? `permission denied for uid ${process.getuid?.() ?? '?'}` : e.code === 'EISDIR' ? 'is a directory' : (e.code ?? e.message);
    return { error: `${path}: cannot read (${e.code ? `${e.code}: ` : ''}${why})` };
  }
}

function pemBlocks(text: string, label: RegExp): string[] {
  const re = /-----BEGIN ([A-Z0-9 ]+)-----[\s\S]*?-----END \1-----/g;
  const out: string[] = [];
  for (const m of text.matchAll(re)) if (label.test(m[1]!)) out.push(m[0]);
  return out;
}

/** "CN=name" of a distinguished name as X509Certificate prints it (one RDN a line). */
function commonName(dn: string): string {
  const cn = /(?:^|\n)CN=([^\n]*)/.exec(dn)?.[1];
  return cn ? `CN=${cn}` : dn.replace(/\n/g, ', ') || '(empty subject)';
}

function subjectCN(cert: X509Certificate): string {
  return commonName(cert.subject);
}

function validity(cert: X509Certificate, now: Date): string | undefined {
  const from = new Date(cert.validFrom);
  const to = new Date(cert.validTo);
  if (now < from) return `not valid before ${from.toISOString()}`;
  if (now > to) return `expired on ${to.toISOString()}`;
  return undefined;
}

function parseCertificates(path: string, data: Buffer): { certs: X509Certificate[] } | { error: string } {
  const blocks = pemBlocks(data.toString('utf8'), /^(TRUSTED )?CERTIFICATE$/);
  if (blocks.length === 0) return { error: `${path}: no PEM certificate in the file (expected "-----BEGIN CERTIFICATE-----")` };
  const certs: X509Certificate[] = [];
  for (const [i, block] of blocks.entries()) {
    try {
      certs.push(new X509Certificate(block));
    } catch (err) {
      return { error: `${path}: certificate #${i + 1} does not parse (${(err as Error).message})` };
    }
  }
  return { certs };
}

function checkCa(path: string | undefined, now: Date): CheckResult & { ok: boolean } {
  const name = 'ca-cert';
  if (!path) return { name, status: 'fail', detail: '--ca-cert is not set', ok: false };
  const r = readable(path);
  if ('error' in r) return { name, status: 'fail', detail: r.error, ok: false };
  const parsed = parseCertificates(path, r.data);
  if ('error' in parsed) return { name, status: 'fail', detail: parsed.error, ok: false };
  const valid = parsed.certs.filter((c) => validity(c, now) === undefined);
  if (valid.length === 0) {
    const why = parsed.certs.map((c) => `${subjectCN(c)} ${validity(c, now)}`).join('; ');
    return { name, status: 'fail', detail: `${path}: no currently valid certificate (${why})`, ok: false };
  }
  const first = valid[0]!;
  return {
    name,
    status: 'pass',
    detail: `${path}: ${parsed.certs.length} certificate(s), ${subjectCN(first)} valid until ${new Date(first.validTo).toISOString()}`,
    ok: true,
  };
}

interface ClientCredentials {
  results: CheckResult[];
  ok: boolean;
}

function checkClientCertAndKey(certPath: string, keyPath: string, now: Date): ClientCredentials {
  const results: CheckResult[] = [];
  let cert: X509Certificate | undefined;
  let certOk = false;
  const rc = readable(certPath);
  if ('error' in rc) {
    results.push({ name: 'agent-cert', status: 'fail', detail: rc.error });
  } else {
    const parsed = parseCertificates(certPath, rc.data);
    if ('error' in parsed) {
      results.push({ name: 'agent-cert', status: 'fail', detail: parsed.error });
    } else {
      cert = parsed.certs[0]!;
      const bad = validity(cert, now);
      const eku = cert.keyUsage;
      if (bad) {
        results.push({ name: 'agent-cert', status: 'fail', detail: `${certPath}: ${subjectCN(cert)} is ${bad}` });
      } else if (eku && eku.length > 0 && !eku.includes(OID_CLIENT_AUTH) && !eku.includes(OID_ANY_EKU)) {
        results.push({ name: 'agent-cert', status: 'fail', detail: `${certPath}: ${subjectCN(cert)} is not a client certificate (extended key usage lacks clientAuth)` });
      } else {
        certOk = true;
        results.push({ name: 'agent-cert', status: 'pass', detail: `${certPath}: ${subjectCN(cert)}, issued by ${commonName(cert.issuer)}, valid until ${new Date(cert.validTo).toISOString()}` });
      }
    }
  }
  let keyOk = false;
  const rk = readable(keyPath);
  if ('error' in rk) {
    results.push({ name: 'agent-key', status: 'fail', detail: rk.error });
  } else {
    let key: KeyObject | undefined;
    try {
      key = createPrivateKey(rk.data);
    } catch (err) {
      results.push({ name: 'agent-key', status: 'fail', detail: `${keyPath}: not a PEM private key (${(err as Error).message})` });
    }
    if (key) {
      if (cert && !cert.checkPrivateKey(key)) {
        results.push({ name: 'agent-key', status: 'fail', detail: `${keyPath}: does not belong to ${certPath} (the public keys differ)` });
      } else {
        keyOk = true;
        const matched = cert ? `, matches ${certPath}` : '';
        results.push({ name: 'agent-key', status: 'pass', detail: `${keyPath}: ${key.asymmetricKeyType ?? 'private'} key${matched}` });
      }
    }
  }
  return { results, ok: certOk && keyOk };
}

function checkToken(path: string): CheckResult & { ok: boolean } {
  const r = readable(path);
  if ('error' in r) return { name: 'token', status: 'fail', detail: r.error, ok: false };
  if (r.data.toString('utf8').trim() === '') return { name: 'token', status: 'fail', detail: `${path}: the file is empty`, ok: false };
  return { name: 'token', status: 'pass', detail: `${path}: ${r.data.length} bytes`, ok: true };
}

// ---------------------------------------------------------------- server

function describeNetError(err: NodeJS.ErrnoException, target: string, timeoutMs: number): string {
  switch (err.code) {
    case 'ECONNREFUSED':
      return `${target}: connection refused (is the kanal server running, and is its --agent-port reachable from here?)`;
    case 'ETIMEDOUT':
    case 'TIMEOUT':
      return `${target}: no answer within ${timeoutMs} ms (firewall, wrong address, or server down)`;
    case 'ENOTFOUND':
    case 'EAI_AGAIN':
      return `${target}: cannot resolve the host name (${err.code})`;
    case 'EHOSTUNREACH':
    case 'ENETUNREACH':
      return `${target}: no route to the server (${err.code})`;
    case 'ECONNRESET':
      return `${target}: the server closed the connection during the TLS handshake (ECONNRESET)`;
    default:
      break;
  }
  if (err.code && /CERT|SELF_SIGNED|ISSUER|SIGNATURE|ALTNAME|VERIFY/.test(err.code)) {
    return `${target}: the server certificate is not trusted: ${err.message} (${err.code}); check --ca-cert and --tls-server-name`;
  }
  return `${target}: ${err.message}${err.code ? ` (${err.code})` : ''}`;
}

interface TlsMaterial {
  ca: Buffer;
  cert?: Buffer;
  key?: Buffer;
}

function checkServerTls(opts: PreflightOptions, material: TlsMaterial): Promise<CheckResult & { ok: boolean }> {
  const { host, port, serverName } = opts.server;
  const target = formatHostPort({ host, port });
  const verifyName = serverName ?? host;
  return new Promise((resolve) => {
    let settled = false;
    const done = (r: CheckResult & { ok: boolean }): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      socket.end();
      socket.destroySoon();
      resolve(r);
    };
    const socket = tls.connect({
      host,
      port,
      ca: material.ca,
      cert: material.cert,
      key: material.key,
      servername: isIP(verifyName) === 0 ? verifyName : undefined,
      checkServerIdentity: (_hostname, cert) => tls.checkServerIdentity(verifyName, cert),
      ALPNProtocols: ['h2'],
    });
    const timer = setTimeout(() => done({ name: 'server-tls', status: 'fail', detail: describeNetError({ name: 'Error', message: 'timeout', code: 'TIMEOUT' }, target, opts.connectTimeoutMs), ok: false }), opts.connectTimeoutMs);
    socket.once('secureConnect', () => {
      if (socket.alpnProtocol !== 'h2') {
        done({ name: 'server-tls', status: 'fail', detail: `${target}: TLS works but the server did not choose HTTP/2 (ALPN ${socket.alpnProtocol || 'none'}); is this a kanal/Konnectivity agent port?`, ok: false });
        return;
      }
      const peer = socket.getPeerCertificate();
      const cn = peer?.subject?.CN ? `CN=${String(peer.subject.CN)}` : 'certificate';
      const client = material.cert ? 'client certificate accepted' : 'no client certificate';
      const protocol = socket.getProtocol() ?? 'TLS';
      // With TLS 1.3 the client finishes first; the server judges our
      // certificate afterwards. An HTTP/2 server that kept the connection
      // sends its SETTINGS frame at once, one that refused us closes it.
      socket.once('data', () => {
        done({ name: 'server-tls', status: 'pass', detail: `${target}: ${protocol} handshake ok, server ${cn} verified as ${verifyName}, ALPN h2, ${client}`, ok: true });
      });
      socket.once('close', () => {
        const why = material.cert
          ? "it refused the agent certificate (is --agent-cert signed by the CA in the server's --cluster-ca-cert?)"
          : 'it requires a client certificate (--agent-cert/--agent-key), unless started with --allow-unauthenticated-agents';
        done({ name: 'server-tls', status: 'fail', detail: `${target}: the server closed the connection right after the TLS handshake: ${why}`, ok: false });
      });
    });
    socket.once('error', (err: NodeJS.ErrnoException) => done({ name: 'server-tls', status: 'fail', detail: describeNetError(err, target, opts.connectTimeoutMs), ok: false }));
  });
}

async function checkAgentStream(opts: PreflightOptions, material: TlsMaterial): Promise<CheckResult[]> {
  const results: CheckResult[] = [];
  const target = formatHostPort({ host: opts.server.host, port: opts.server.port });
  const tokenFile = opts.tokenFile;
  let conn;
  try {
    conn = await connectToServer({
      target,
      tls: { ca: material.ca, cert: material.cert, key: material.key, serverName: opts.server.serverName },
      agentID: opts.agentID,
      agentIdentifiers: opts.agentIdentifiers,
      token: tokenFile ? () => fs.readFileSync(tokenFile, 'utf8').trim() : undefined,
      features: AGENT_FEATURES,
      transport: opts.transport,
      dialHandler: () => Promise.reject(new DialError('refused', 'kanal agent --check does not accept dials')),
      connectTimeoutMs: opts.connectTimeoutMs,
      log: opts.log,
    });
  } catch (err) {
    const msg = (err as Error).message;
    const hint = /UNAUTHENTICATED|drop|closed|reset|refused|UNAVAILABLE/i.test(msg)
      ? ' (the server likely refused the agent credentials: is --agent-cert signed by the CA in the server\'s --cluster-ca-cert, or is the token accepted?)'
      : '';
    results.push({ name: 'server-accepts-agent', status: 'fail', detail: `${target}: AgentService/Connect failed: ${msg}${hint}` });
    if (opts.node) results.push({ name: 'node-dial', status: 'skip', detail: 'needs an accepted agent stream' });
    return results;
  }
  try {
    // Ask the server not to route control-plane dials to this short-lived stream.
    conn.tunnel.sendDrain();
    const features = formatFeatures(conn.tunnel.features) || 'none (upstream Konnectivity server)';
    results.push({
      name: 'server-accepts-agent',
      status: 'pass',
      detail: `${target}: accepted as agent ${opts.agentID} by server ${conn.serverID} (server count ${conn.serverCount}); features: ${features}`,
    });
    if (opts.node) {
      if (!conn.tunnel.features.has(Feature.NodeDial)) {
        results.push({
          name: 'node-dial',
          status: 'fail',
          detail: `server ${conn.serverID} does not support node -> control plane dials (upstream Konnectivity?); the --target listeners would refuse every connection`,
        });
      } else {
        results.push({ name: 'node-dial', status: 'pass', detail: `node -> control plane dials negotiated with server ${conn.serverID}` });
        for (const t of opts.node.targets) {
          const name = `target ${t.localPort}`;
          const t0 = Date.now();
          try {
            const c = await conn.tunnel.dial(t.destination, { timeoutMs: opts.dialTimeoutMs });
            c.destroy();
            results.push({ name, status: 'pass', detail: `server ${conn.serverID} dialled ${t.destination} in ${Date.now() - t0} ms` });
          } catch (err) {
            const e = err as Error;
            const hint = err instanceof DialError && err.failure === 'forbidden' ? ` (add --allowed-destination ${t.destination} on the server)` : '';
            results.push({ name, status: 'fail', detail: `server ${conn.serverID} could not dial ${t.destination}: ${e.message}${hint}` });
          }
        }
      }
    }
  } finally {
    conn.close();
  }
  return results;
}

// ---------------------------------------------------------------- kernel

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

function unprivilegedPortStart(): number {
  try {
    return Number(fs.readFileSync('/proc/sys/net/ipv4/ip_unprivileged_port_start', 'utf8').trim());
  } catch {
    return 1024;
  }
}

function kernelChecks(opts: PreflightOptions): CheckResult[] {
  const results: CheckResult[] = [];
  const node = opts.node;
  const probe = opts.netlink ?? (() => checkNetlink());
  const nl = probe();
  if (nl.ok) results.push({ name: 'netlink', status: 'pass', detail: nl.detail });
  else results.push({ name: 'netlink', status: node ? 'fail' : 'warn', detail: node ? nl.detail : `${nl.detail} (not needed without --bind-address)` });

  if (!node) {
    results.push({ name: 'CAP_NET_ADMIN', status: 'skip', detail: 'not needed without --bind-address' });
  } else if (node.interfaceType === 'none') {
    results.push({ name: 'CAP_NET_ADMIN', status: 'skip', detail: 'not needed with --bind-interface-type none' });
    const present = Object.values(os.networkInterfaces()).some((list) => list?.some((a) => a.address === node.bindAddress));
    results.push(
      present
        ? { name: 'bind-address', status: 'pass', detail: `${node.bindAddress} is configured on this host` }
        : { name: 'bind-address', status: 'fail', detail: `${node.bindAddress} is not configured on any interface, and --bind-interface-type none means the agent will not add it` },
    );
  } else {
    const cap = hasCapability(CAP_NET_ADMIN);
    results.push(
      cap === false
        ? { name: 'CAP_NET_ADMIN', status: 'fail', detail: `missing: the agent cannot create ${node.interfaceType} interface for ${node.bindAddress} (run as root, or grant CAP_NET_ADMIN: AmbientCapabilities= in the unit, capabilities.add: [NET_ADMIN] in a pod)` }
        : { name: 'CAP_NET_ADMIN', status: cap ? 'pass' : 'warn', detail: cap ? 'present (needed to create the host-scoped interface)' : 'cannot tell (no /proc/self/status)' },
    );
  }

  const lowPorts = [...(node?.targets.map((t) => t.localPort) ?? []), ...(opts.healthPort ? [opts.healthPort] : [])].filter((p) => p > 0 && p < unprivilegedPortStart());
  if (lowPorts.length > 0) {
    const cap = hasCapability(CAP_NET_BIND_SERVICE);
    results.push(
      cap === false
        ? { name: 'CAP_NET_BIND_SERVICE', status: 'fail', detail: `missing: port(s) ${lowPorts.join(', ')} are privileged on this host` }
        : { name: 'CAP_NET_BIND_SERVICE', status: cap ? 'pass' : 'warn', detail: `${cap ? 'present' : 'cannot tell'} (port(s) ${lowPorts.join(', ')} are privileged)` },
    );
  }
  return results;
}

// ---------------------------------------------------------------- all together

export async function runPreflight(opts: PreflightOptions, now: Date = new Date()): Promise<CheckResult[]> {
  const results: CheckResult[] = [];
  const ca = checkCa(opts.server.caFile, now);
  results.push(ca);
  let credsOk = ca.ok;
  const { certFile, keyFile } = opts.server;
  if (certFile && keyFile) {
    const client = checkClientCertAndKey(certFile, keyFile, now);
    results.push(...client.results);
    credsOk &&= client.ok;
  }
  if (opts.tokenFile) {
    const token = checkToken(opts.tokenFile);
    results.push(token);
    credsOk &&= token.ok;
  }
  if (!certFile && !opts.tokenFile) {
    results.push({ name: 'agent-credentials', status: 'warn', detail: 'neither --agent-cert nor --service-account-token-path: only a server started with --allow-unauthenticated-agents will accept this agent' });
  }

  if (!credsOk) {
    const why = 'needs readable, valid credentials (fix the failures above)';
    results.push({ name: 'server-tls', status: 'skip', detail: why }, { name: 'server-accepts-agent', status: 'skip', detail: why });
  } else {
    const material: TlsMaterial = {
      ca: fs.readFileSync(opts.server.caFile!),
      cert: certFile ? fs.readFileSync(certFile) : undefined,
      key: keyFile ? fs.readFileSync(keyFile) : undefined,
    };
    const handshake = await checkServerTls(opts, material);
    results.push(handshake);
    if (handshake.ok) results.push(...(await checkAgentStream(opts, material)));
    else results.push({ name: 'server-accepts-agent', status: 'skip', detail: 'needs a working TLS connection to the server' });
  }

  results.push(...kernelChecks(opts));
  return results;
}

export function preflightPassed(results: readonly CheckResult[]): boolean {
  return results.every((r) => r.status !== 'fail');
}

/** The pass/fail list as printed by `kanal agent --check`. */
export function formatPreflight(results: readonly CheckResult[], heading: string): string {
  const width = Math.max(...results.map((r) => r.name.length), 8);
  const lines = [heading];
  for (const r of results) lines.push(`  ${r.status.toUpperCase().padEnd(4)}  ${r.name.padEnd(width)}  ${r.detail}`);
  const count = (s: CheckStatus): number => results.filter((r) => r.status === s).length;
  const failed = count('fail');
  const summary = [`${count('pass')} passed`, `${failed} failed`];
  if (count('warn') > 0) summary.push(`${count('warn')} warning(s)`);
  if (count('skip') > 0) summary.push(`${count('skip')} skipped`);
  lines.push(`${summary.join(', ')}: ${failed === 0 ? 'ready to run' : 'NOT ready: fix the FAIL lines above'}`);
  return `${lines.join('\n')}\n`;
}
