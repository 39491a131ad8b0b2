/**
 * Writes a complete set of throwaway certificates for the demo and the tests:
 *
 *   ca.crt / ca.key                 CA of the agent side: signs the agent port's certificate
 *                                   and the agents' client certificates (--cluster-ca-cert)
 *   server.crt / server.key         agent-facing listener of the kanal server
 *   agent.crt / agent.key           agent client certificate (CN kanal-agent), shared by
 *                                   tests that model one credential across a DaemonSet
 *   frontend-ca.crt / .key          CA of the frontend side, a different one (an agent
 *                                   credential must never open the frontend): signs ...
 *   frontend.crt / frontend.key     ... the frontend listener (the KAS connects here)
 *   frontend-client.crt / .key      ... and the KAS's client certificate (--server-ca-cert)
 *   rogue-ca.crt                    an unrelated CA ...
 *   rogue-agent.crt / .key          ... and an agent certificate it issued (must be refused)
 *   agents/NAME.crt / .key          one agent's own certificate (CN NAME), on demand
 *                                   ({@link issueAgentCertificate})
 *
 * Keys are written with mode 0600, certificates with 0644.
 */
import { mkdir, writeFile, chmod, readFile, access, rename } from 'node:fs/promises';
import path from 'node:path';
import { createCertificateAuthority, loadCertificateAuthority } from './certificate-authority.js';

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
  frontendCaCert: string;
  frontendCaKey: string;
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

  const [ca, frontendCa, rogueCa] = await Promise.all([
    createCertificateAuthority('kanal-throwaway-ca'),
    createCertificateAuthority('kanal-throwaway-frontend-ca'),
    createCertificateAuthority('kanal-rogue-ca'),
  ]);
  const [server, frontend, frontendClient, agent, rogueAgent] = await Promise.all([
    ca.issue({ commonName: 'kanal-server', dnsNames, ipAddresses, usage: 'server' }),
    frontendCa.issue({ commonName: 'kanal-frontend', dnsNames, ipAddresses, usage: 'server' }),
    frontendCa.issue({ commonName: 'kube-apiserver', usage: 'client' }),
    ca.issue({ commonName: AGENT_COMMON_NAME, usage: 'client' }),
    rogueCa.issue({ commonName: AGENT_COMMON_NAME, usage: 'client' }),
  ]);

  const p = (name: string): string => path.join(root, name);
  const pki: ThrowawayPki = {
    dir: root,
    caCert: p('ca.crt'),
    caKey: p('ca.key'),
    frontendCaCert: p('frontend-ca.crt'),
    frontendCaKey: p('frontend-ca.key'),
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
    writePublic(pki.frontendCaCert, frontendCa.certPem),
    writeSecret(pki.frontendCaKey, frontendCa.keyPem),
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

/** Paths of one agent's own client certificate. */
export interface AgentCredential {
  cert: string;
  key: string;
}

/** Issues in flight or done, per file: concurrent callers in one process share one issue. */
const issued = new Map<string, Promise<AgentCredential>>();

/**
 * Issues (once; later calls return the same files) a client certificate with
 * CN `name` from the throwaway CA, so each agent of a test holds a credential
 * of its own, as each node does in a real cluster.
 */
export function issueAgentCertificate(pki: ThrowawayPki, name: string): Promise<AgentCredential> {
  if (!/^[A-Za-z0-9_.-]{1,64}$/.test(name))
    return Promise.reject(new Error(`agent certificate name ${JSON.stringify(name)}: 1-64 letters, digits, '.', '_' or '-'`));
  const dir = path.join(pki.dir, 'agents');
  const files = { cert: path.join(dir, `${name}.crt`), key: path.join(dir, `${name}.key`) };
  let pending = issued.get(files.cert);
  if (!pending) {
    pending = issueInto(pki, name, dir, files);
    issued.set(files.cert, pending);
  }
  return pending;
}

async function issueInto(pki: ThrowawayPki, name: string, dir: string, files: AgentCredential): Promise<AgentCredential> {
  // Another process (a test's child) may have issued it already: the cert is renamed into place last.
  if (await exists(files.cert)) return files;
  const ca = await loadCertificateAuthority(await readFile(pki.caCert, 'utf8'), await readFile(pki.caKey, 'utf8'));
  const cert = await ca.issue({ commonName: name, usage: 'client' });
  await mkdir(dir, { recursive: true });
  const tmp = `.${process.pid}.${Date.now()}`;
  await writeSecret(files.key + tmp, cert.keyPem);
  await writePublic(files.cert + tmp, cert.certPem);
  await rename(files.key + tmp, files.key);
  await rename(files.cert + tmp, files.cert);
  return files;
}

async function exists(file: string): Promise<boolean> {
  return access(file).then(
    () => true,
    () => false,
  );
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
