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
 *   service-names                           with a cluster DNS given: it answers for kubernetes.default.svc
 *   netlink, CAP_NET_ADMIN, ...             the kernel side of the host-scoped interface
 */
import fs from 'node:fs';
import { escapeForTerminal } from '../common/terminal-text.js';

import type { CheckResult, CheckStatus, PreflightOptions } from './preflight-options.js';
import { checkCa, checkClientCertAndKey, checkToken } from './preflight-credentials.js';
import { checkAgentStream, checkServerTls, type TlsMaterial } from './preflight-server.js';
import { kernelChecks } from './preflight-kernel.js';
import { checkClusterDns } from './preflight-dns.js';
import { FLAG } from './settings.js';
import { ALLOW_UNAUTHENTICATED_AGENTS } from './connect-diagnosis.js';

export type { CheckResult, CheckStatus, PreflightOptions } from './preflight-options.js';

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
      detail: `neither ${FLAG['agent-cert']} nor ${FLAG['service-account-token-path']}: only a server started with ${ALLOW_UNAUTHENTICATED_AGENTS} will accept this agent`,
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

  if (opts.names) results.push(await checkClusterDns(opts.names.clusterDns, opts.names.clusterDomain));
  results.push(...(await kernelChecks(opts)));
  return results;
}

export function preflightPassed(results: readonly CheckResult[]): boolean {
  return results.every((r) => r.status !== 'fail');
}

/**
 * The pass/fail list as printed by `kanal agent --check`. A detail quotes
 * what the server chose (its certificate's subject, serverID, error texts),
 * so every line is escaped for the terminal (terminal-text.ts).
 */
export function formatPreflight(results: readonly CheckResult[], heading: string): string {
  const shown = results.map((r) => ({ ...r, name: escapeForTerminal(r.name), detail: escapeForTerminal(r.detail) }));
  const width = Math.max(...shown.map((r) => r.name.length), 8);
  const lines = [escapeForTerminal(heading)];
  for (const r of shown) lines.push(`  ${r.status.toUpperCase().padEnd(4)}  ${r.name.padEnd(width)}  ${r.detail}`);
  const count = (s: CheckStatus): number => results.filter((r) => r.status === s).length;
  const failed = count('fail');
  const summary = [`${count('pass')} passed`, `${failed} failed`];
  if (count('warn') > 0) summary.push(`${count('warn')} warning(s)`);
  if (count('skip') > 0) summary.push(`${count('skip')} skipped`);
  lines.push(`${summary.join(', ')}: ${failed === 0 ? 'ready to run' : 'NOT ready: fix the FAIL lines above'}`);
  return `${lines.join('\n')}\n`;
}
