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
import tls from 'node:tls';
import { isIP } from 'node:net';
import type { X509Certificate } from 'node:crypto';
import type { Logger } from 'pino';
import type { Transport } from '../transport/transport.js';
import { Feature, formatFeatures, type FeatureSet } from '../wire/features.js';
import { DialError } from '../tunnel/errors.js';
import { formatHostPort } from '../common/host-port.js';
import { checkNetlink } from '../../native/host-interface.js';
import {
  CredentialFileError,
  checkKeyPair,
  commonName,
  loadCertificates,
  loadPrivateKey,
  loadToken,
  validityProblem,
  type CertificateFile,
} from '../common/credential-files.js';
import { connectToServer } from './server-connection.js';
import { ServiceAccountTokenSource } from './service-account-token.js';
import type { Target } from './target.js';
import type { InterfaceType } from './host-interface-manager.js';
import { bindProblem, describeBindProblem } from './bind-probe.js';
import { errorMessage } from '../common/error-message.js';

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
const AGENT_FEATURES: FeatureSet = new Set([Feature.Window, Feature.HalfClose, Feature.NodeDial]);

// ---------------------------------------------------------------- credentials

/** The check's result for one loader: pass with `detail(value)`, or fail with the loader's message (flag, path, cause). */
function fileCheck<T>(name: string, load: () => T, detail: (value: T) => CheckResult): { result: CheckResult; value?: T } {
  try {
    const value = load();
    return { result: detail(value), value };
  } catch (err) {
    if (!(err instanceof CredentialFileError)) throw err;
    return { result: { name, status: 'fail', detail: err.message } };
  }
}

function validUntil(cert: X509Certificate): string {
  return `valid until ${new Date(cert.validTo).toISOString()}`;
}

function checkCa(path: string | undefined, now: Date): { result: CheckResult; value?: CertificateFile } {
  const name = 'ca-cert';
  if (!path) return { result: { name, status: 'fail', detail: '--ca-cert is not set' } };
  return fileCheck(
    name,
    () => loadCertificates({ flag: name, path }),
    (ca) => {
      const valid = ca.certs.filter((c) => validityProblem(c, now) === undefined);
      if (valid.length === 0) {
        const why = ca.certs.map((c) => `${commonName(c.subject)} ${validityProblem(c, now)}`).join('; ');
        return { name, status: 'fail', detail: `${path}: no currently valid certificate (${why})` };
      }
      return {
        name,
        status: 'pass',
        detail: `${path}: ${ca.certs.length} certificate(s), ${commonName(valid[0].subject)} ${validUntil(valid[0])}`,
      };
    },
  );
}

interface ClientCredentials {
  results: CheckResult[];
  ok: boolean;
}

function checkClientCertAndKey(certPath: string, keyPath: string, now: Date): ClientCredentials {
  const certFile = { flag: 'agent-cert', path: certPath };
  const keyFile = { flag: 'agent-key', path: keyPath };
  const cert = fileCheck(
    'agent-cert',
    () => loadCertificates(certFile),
    (c): CheckResult => {
      const first = c.certs[0];
      const bad = validityProblem(first, now);
      if (bad) return { name: 'agent-cert', status: 'fail', detail: `${certPath}: ${commonName(first.subject)} is ${bad}` };
      return {
        name: 'agent-cert',
        status: 'pass',
        detail: `${certPath}: ${commonName(first.subject)}, issued by ${commonName(first.issuer)}, ${validUntil(first)}`,
      };
    },
  );
  const key = fileCheck(
    'agent-key',
    () => loadPrivateKey(keyFile, certFile.flag),
    (k): CheckResult => ({ name: 'agent-key', status: 'pass', detail: `${keyPath}: ${k.key.asymmetricKeyType ?? 'private'} key` }),
  );
  const results = [cert.result, key.result];
  if (cert.value && key.value && cert.result.status === 'pass') {
    try {
      checkKeyPair(cert.value, key.value, 'client');
      results[1] = { ...results[1], detail: `${results[1].detail}, matches ${certPath}` };
    } catch (err) {
      if (!(err instanceof CredentialFileError)) throw err;
      const which = err.flag === keyFile.flag ? 1 : 0;
      results[which] = { ...results[which], status: 'fail', detail: err.message };
    }
  }
  return { results, ok: results.every((r) => r.status === 'pass') };
}

function checkToken(path: string): CheckResult {
  return fileCheck(
    'token',
    () => loadToken({ flag: 'service-account-token-path', path }),
    (token) => ({ name: 'token', status: 'pass', detail: `${path}: ${token.length} bytes` }),
  ).result;
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
    const timer = setTimeout(
      () =>
        done({
          name: 'server-tls',
          status: 'fail',
          detail: describeNetError({ name: 'Error', message: 'timeout', code: 'TIMEOUT' }, target, opts.connectTimeoutMs),
          ok: false,
        }),
      opts.connectTimeoutMs,
    );
    socket.once('secureConnect', () => {
      if (socket.alpnProtocol !== 'h2') {
        done({
          name: 'server-tls',
          status: 'fail',
          detail: `${target}: TLS works but the server did not choose HTTP/2 (ALPN ${socket.alpnProtocol || 'none'}); is this a kanal/Konnectivity agent port?`,
          ok: false,
        });
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
        done({
          name: 'server-tls',
          status: 'pass',
          detail: `${target}: ${protocol} handshake ok, server ${cn} verified as ${verifyName}, ALPN h2, ${client}`,
          ok: true,
        });
      });
      socket.once('close', () => {
        const why = material.cert
          ? "it refused the agent certificate (is --agent-cert signed by the CA in the server's --cluster-ca-cert?)"
          : 'it requires a client certificate (--agent-cert/--agent-key), unless started with --allow-unauthenticated-agents';
        done({
          name: 'server-tls',
          status: 'fail',
          detail: `${target}: the server closed the connection right after the TLS handshake: ${why}`,
          ok: false,
        });
      });
    });
    socket.once('error', (err: NodeJS.ErrnoException) =>
      done({ name: 'server-tls', status: 'fail', detail: describeNetError(err, target, opts.connectTimeoutMs), ok: false }),
    );
  });
}

async function checkAgentStream(opts: PreflightOptions, material: TlsMaterial): Promise<CheckResult[]> {
  const results: CheckResult[] = [];
  const target = formatHostPort({ host: opts.server.host, port: opts.server.port });
  const token = opts.tokenFile === undefined ? undefined : new ServiceAccountTokenSource(opts.tokenFile);
  let conn;
  try {
    conn = await connectToServer({
      target,
      tls: { ca: material.ca, cert: material.cert, key: material.key, serverName: opts.server.serverName },
      agentID: opts.agentID,
      agentIdentifiers: opts.agentIdentifiers,
      token: token && (() => token.readSync()),
      features: AGENT_FEATURES,
      transport: opts.transport,
      dialHandler: () => Promise.reject(new DialError('refused', 'kanal agent --check does not accept dials')),
      connectTimeoutMs: opts.connectTimeoutMs,
      log: opts.log,
    });
  } catch (err) {
    const msg = errorMessage(err);
    const hint = /UNAUTHENTICATED|drop|closed|reset|refused|UNAVAILABLE/i.test(msg)
      ? " (the server likely refused the agent credentials: is --agent-cert signed by the CA in the server's --cluster-ca-cert, or is the token accepted?)"
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
            c.close();
            results.push({ name, status: 'pass', detail: `server ${conn.serverID} dialled ${t.destination} in ${Date.now() - t0} ms` });
          } catch (err) {
            const hint =
              err instanceof DialError && err.failure === 'forbidden' ? ` (add --allowed-destination ${t.destination} on the server)` : '';
            results.push({
              name,
              status: 'fail',
              detail: `server ${conn.serverID} could not dial ${t.destination}: ${errorMessage(err)}${hint}`,
            });
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

async function kernelChecks(opts: PreflightOptions): Promise<CheckResult[]> {
  const results: CheckResult[] = [];
  const node = opts.node;
  const probe = opts.netlink ?? (() => checkNetlink());
  const nl = probe();
  if (nl.ok) results.push({ name: 'netlink', status: 'pass', detail: nl.detail });
  else
    results.push({
      name: 'netlink',
      status: node ? 'fail' : 'warn',
      detail: node ? nl.detail : `${nl.detail} (not needed without --bind-address)`,
    });

  if (!node) {
    results.push({ name: 'CAP_NET_ADMIN', status: 'skip', detail: 'not needed without --bind-address' });
  } else if (node.interfaceType === 'none') {
    results.push({ name: 'CAP_NET_ADMIN', status: 'skip', detail: 'not needed with --bind-interface-type none' });
    // The agent only needs to listen there: 127.0.0.2 is on no interface, yet usable through lo (docs/operations.md).
    const problem = await bindProblem(node.bindAddress);
    results.push(
      problem
        ? { name: 'bind-address', status: 'fail', detail: describeBindProblem(node.bindAddress, problem) }
        : { name: 'bind-address', status: 'pass', detail: `${node.bindAddress} can be listened on` },
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

// ---------------------------------------------------------------- all together

export async function runPreflight(opts: PreflightOptions, now: Date = new Date()): Promise<CheckResult[]> {
  const results: CheckResult[] = [];
  const { result: ca, value: caFile } = checkCa(opts.server.caFile, now);
  results.push(ca);
  let credsOk = ca.status === 'pass';
  const { certFile, keyFile } = opts.server;
  if (certFile && keyFile) {
    const client = checkClientCertAndKey(certFile, keyFile, now);
    results.push(...client.results);
    credsOk &&= client.ok;
  }
  if (opts.tokenFile) {
    const token = checkToken(opts.tokenFile);
    results.push(token);
    credsOk &&= token.status === 'pass';
  }
  if (!certFile && !opts.tokenFile) {
    results.push({
      name: 'agent-credentials',
      status: 'warn',
      detail:
        'neither --agent-cert nor --service-account-token-path: only a server started with --allow-unauthenticated-agents will accept this agent',
    });
  }

  if (!credsOk) {
    const why = 'needs readable, valid credentials (fix the failures above)';
    results.push({ name: 'server-tls', status: 'skip', detail: why }, { name: 'server-accepts-agent', status: 'skip', detail: why });
  } else {
    const material: TlsMaterial = {
      ca: caFile!.pem,
      cert: certFile ? fs.readFileSync(certFile) : undefined,
      key: keyFile ? fs.readFileSync(keyFile) : undefined,
    };
    const handshake = await checkServerTls(opts, material);
    results.push(handshake);
    if (handshake.ok) results.push(...(await checkAgentStream(opts, material)));
    else results.push({ name: 'server-accepts-agent', status: 'skip', detail: 'needs a working TLS connection to the server' });
  }

  results.push(...(await kernelChecks(opts)));
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
