/**
 * Writes a complete set of throwaway certificates for the demo and the tests:
 *
 *   ca.crt                          trusted CA (server + agents + frontend clients)
 *   server.crt / server.key         agent-facing listener of the kanal server
 *   frontend.crt / frontend.key     frontend listener (the KAS connects here)
 *   frontend-client.crt / .key      client certificate of the KAS side
 *   agent.crt / agent.key           agent client certificate (CN kanal-agent)
 *   rogue-ca.crt                    an unrelated CA ...
 *   rogue-agent.crt / .key          ... and an agent certificate it issued (must be refused)
 *
 * Keys are written with mode 0600, certificates with 0644.
 */
import { mkdir, writeFile, chmod } from 'node:fs/promises';
import path from 'node:path';
import { createCertificateAuthority } from './certificate-authority.js';

export interface ThrowawayPkiOptions {
  /** Extra IP SANs for server.crt and frontend.crt (127.0.0.1 and ::1 are always present). */
  serverIps?: string[];
  /** Extra DNS SANs for server.crt and frontend.crt (localhost is always present). */
  serverDns?: string[];
}

/** Absolute paths of the files written by {@link writeThrowawayPki}. */
export interface ThrowawayPki {
  dir: string;
  caCert: string;
  caKey: string;
  serverCert: string;
  serverKey: string;
  frontendCert: string;
  frontendKey: string;
  frontendClientCert: string;
  frontendClientKey: string;
  agentCert: string;
  agentKey: string;
  rogueCaCert: string;
  rogueAgentCert: string;
  rogueAgentKey: string;
}

export const AGENT_COMMON_NAME = 'kanal-agent';

export async function writeThrowawayPki(dir: string, opts: ThrowawayPkiOptions = {}): Promise<ThrowawayPki> {
  const root = path.resolve(dir);
  await mkdir(root, { recursive: true });

  const dnsNames = unique(['localhost', ...(opts.serverDns ?? [])]);
  const ipAddresses = unique(['127.0.0.1', '::1', ...(opts.serverIps ?? [])]);

  const ca = await createCertificateAuthority('kanal-throwaway-ca');
  const rogueCa = await createCertificateAuthority('kanal-rogue-ca');
  const [server, frontend, frontendClient, agent, rogueAgent] = await Promise.all([
    ca.issue({ commonName: 'kanal-server', dnsNames, ipAddresses, usage: 'server' }),
    ca.issue({ commonName: 'kanal-frontend', dnsNames, ipAddresses, usage: 'server' }),
    ca.issue({ commonName: 'kube-apiserver', usage: 'client' }),
    ca.issue({ commonName: AGENT_COMMON_NAME, usage: 'client' }),
    rogueCa.issue({ commonName: AGENT_COMMON_NAME, usage: 'client' }),
  ]);

  const p = (name: string): string => path.join(root, name);
  const pki: ThrowawayPki = {
    dir: root,
    caCert: p('ca.crt'),
    caKey: p('ca.key'),
    serverCert: p('server.crt'),
    serverKey: p('server.key'),
    frontendCert: p('frontend.crt'),
    frontendKey: p('frontend.key'),
    frontendClientCert: p('frontend-client.crt'),
    frontendClientKey: p('frontend-client.key'),
    agentCert: p('agent.crt'),
    agentKey: p('agent.key'),
    rogueCaCert: p('rogue-ca.crt'),
    rogueAgentCert: p('rogue-agent.crt'),
    rogueAgentKey: p('rogue-agent.key'),
  };

  await Promise.all([
    writePublic(pki.caCert, ca.certPem),
    writeSecret(pki.caKey, ca.keyPem),
    writePublic(pki.serverCert, server.certPem),
    writeSecret(pki.serverKey, server.keyPem),
    writePublic(pki.frontendCert, frontend.certPem),
    writeSecret(pki.frontendKey, frontend.keyPem),
    writePublic(pki.frontendClientCert, frontendClient.certPem),
    writeSecret(pki.frontendClientKey, frontendClient.keyPem),
    writePublic(pki.agentCert, agent.certPem),
    writeSecret(pki.agentKey, agent.keyPem),
    writePublic(pki.rogueCaCert, rogueCa.certPem),
    writePublic(pki.rogueAgentCert, rogueAgent.certPem),
    writeSecret(pki.rogueAgentKey, rogueAgent.keyPem),
  ]);
  return pki;
}

async function writePublic(file: string, pem: string): Promise<void> {
  await writeFile(file, ensureNewline(pem), { mode: 0o644 });
  await chmod(file, 0o644);
}

async function writeSecret(file: string, pem: string): Promise<void> {
  // chmod as well: `mode` only applies when the file is created.
  await writeFile(file, ensureNewline(pem), { mode: 0o600 });
  await chmod(file, 0o600);
}

function ensureNewline(pem: string): string {
  return pem.endsWith('\n') ? pem : `${pem}\n`;
}

function unique(values: string[]): string[] {
  return [...new Set(values)];
}
