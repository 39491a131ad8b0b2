/** `--check`: the server reached with the agent's credentials: TLS with ALPN h2, the agent stream accepted, each --target dialled. */
import tls from 'node:tls';
import { isIP } from 'node:net';
import { Feature, formatFeatures, type FeatureSet } from '../wire/features.js';
import { DialError } from '../tunnel/errors.js';
import { formatHostPort } from '../common/host-port.js';
import { connectToServer } from './server-connection.js';
import { refusedTargetMessage } from './target.js';
import { ServiceAccountTokenSource } from './service-account-token.js';
import { errorMessage } from '../common/error-message.js';
import { diagnoseConnectError, type ConnectAttempt } from './connect-diagnosis.js';
import { alpnNotH2, closedAfterTlsHandshake } from '../transport/connect-stage.js';

import type { CheckResult, PreflightOptions } from './preflight-options.js';

const AGENT_FEATURES: FeatureSet = new Set([Feature.Window, Feature.HalfClose, Feature.NodeDial]);

/** What --check tried, for the shared diagnosis (connect-diagnosis.ts). */
export function checkAttempt(opts: PreflightOptions, clientCertificate: boolean): ConnectAttempt {
  const { host, port, serverName } = opts.server;
  return {
    target: formatHostPort({ host, port }),
    verifyName: serverName ?? host,
    clientCertificate,
    token: opts.tokenFile !== undefined,
    connectTimeoutMs: opts.connectTimeoutMs,
  };
}

export interface TlsMaterial {
  ca: Buffer;
  cert?: Buffer;
  key?: Buffer;
}

export function checkServerTls(opts: PreflightOptions, material: TlsMaterial): Promise<CheckResult & { ok: boolean }> {
  const { host, port, serverName } = opts.server;
  const target = formatHostPort({ host, port });
  const verifyName = serverName ?? host;
  const attempt = checkAttempt(opts, material.cert !== undefined);
  const fail = (err: unknown): CheckResult & { ok: boolean } => ({
    name: 'server-tls',
    status: 'fail',
    detail: diagnoseConnectError(err, attempt).message,
    ok: false,
  });
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
    const timer = setTimeout(() => done(fail(Object.assign(new Error('timeout'), { code: 'TIMEOUT' }))), opts.connectTimeoutMs);
    socket.once('secureConnect', () => {
      if (socket.alpnProtocol !== 'h2') {
        done(fail(alpnNotH2(socket.alpnProtocol)));
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
      socket.once('close', () => done(fail(closedAfterTlsHandshake())));
    });
    socket.once('error', (err: NodeJS.ErrnoException) => done(fail(err)));
  });
}

export async function checkAgentStream(opts: PreflightOptions, material: TlsMaterial): Promise<CheckResult[]> {
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
      targets: opts.node?.targets.map((t) => t.destination),
      transport: opts.transport,
      dialHandler: () => Promise.reject(new DialError('refused', 'kanal agent --check does not accept dials')),
      connectTimeoutMs: opts.connectTimeoutMs,
      log: opts.log,
    });
  } catch (err) {
    const { message } = diagnoseConnectError(err, checkAttempt(opts, material.cert !== undefined));
    results.push({ name: 'server-accepts-agent', status: 'fail', detail: `AgentService/Connect failed: ${message}` });
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
          // The server said so at connect, as it tells the running agent (server-tunnels.ts).
          if (conn.refusedTargets.includes(t.destination)) {
            results.push({ name, status: 'fail', detail: refusedTargetMessage(t, conn.serverID) });
            continue;
          }
          const t0 = Date.now();
          try {
            const c = await conn.tunnel.dial(t.destination, { timeoutMs: opts.dialTimeoutMs });
            c.close();
            results.push({ name, status: 'pass', detail: `server ${conn.serverID} dialled ${t.destination} in ${Date.now() - t0} ms` });
          } catch (err) {
            results.push({
              name,
              status: 'fail',
              detail: `server ${conn.serverID} could not dial ${t.destination}: ${errorMessage(err)}`,
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
