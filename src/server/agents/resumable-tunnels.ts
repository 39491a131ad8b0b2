/**
 * Agent tunnels that can be resumed (docs/protocol.md, "Resume"), by the
 * secret token the server gave each in its response headers. A new stream
 * that names a token takes that tunnel over only if it authenticated as the
 * same credential and announces the same agentID (docs/trust-model.md: a
 * resumed connection belongs to the credential that opened it); a token
 * alone proves nothing. Each tunnel is here from its first stream until it
 * closes for good. Detached ones are bounded per credential: past the
 * bound the oldest is closed.
 */
import { randomBytes } from 'node:crypto';
import type { Tunnel } from '../../tunnel/tunnel.js';
import { sentBytesSlabs } from '../../tunnel/slab-pool.js';
import type { AgentCredential } from '../identity/agent-credential.js';

/** Longest token accepted in an agent's metadata (ours are 22 characters), and how many are looked at. */
export const MAX_RESUME_TOKEN_CHARS = 64;
export const MAX_RESUME_TOKENS = 8;

interface Resumable {
  tunnel: Tunnel;
  credentialKey: string;
  /** Whose it is, for the admin port's /status. */
  credential: AgentCredential;
  agentID: string;
  /** The agent process that opened it (MD_KANAL_INCARNATION). */
  incarnation: string;
}

/** Why a token did not resume a tunnel. */
export type ResumeMiss = 'unknown' | 'other_agent';

export class ResumableTunnels {
  /** token -> tunnel; each tunnel under exactly one token, removed on its 'close'. */
  private readonly byToken = new Map<string, Resumable>();

  /** `maxDetachedPerCredential`: detached tunnels one credential may leave waiting. */
  constructor(private maxDetachedPerCredential: number) {}

  configure(maxDetachedPerCredential: number): void {
    this.maxDetachedPerCredential = maxDetachedPerCredential;
  }

  /** A fresh secret for a new tunnel (128 random bits). */
  newToken(): string {
    return randomBytes(16).toString('base64url');
  }

  /** Registers a new tunnel under `token` (newToken()). */
  add(token: string, tunnel: Tunnel, credential: AgentCredential, agentID: string, incarnation: string): void {
    this.byToken.set(token, { tunnel, credentialKey: credential.key, credential, agentID, incarnation });
    tunnel.once('close', () => this.byToken.delete(token));
    tunnel.on('detached', () => this.bound(credential.key));
  }

  /**
   * The tunnel one of `tokens` names, if it belongs to `credential` and
   * `agentID`; else why none does (the first token's reason).
   */
  claim(tokens: readonly string[], credential: AgentCredential, agentID: string): { token: string; tunnel: Tunnel } | { miss: ResumeMiss } {
    let miss: ResumeMiss = 'unknown';
    for (const token of tokens.slice(0, MAX_RESUME_TOKENS)) {
      const entry = this.byToken.get(token);
      if (!entry || entry.tunnel.closed) continue;
      if (entry.credentialKey !== credential.key || entry.agentID !== agentID) {
        miss = 'other_agent';
        continue;
      }
      return { token, tunnel: entry.tunnel };
    }
    return { miss };
  }

  /** Tunnels waiting for a resume now, and their connections. */
  detached(): { tunnels: number; connections: number } {
    let tunnels = 0;
    let connections = 0;
    for (const { tunnel } of this.byToken.values()) {
      if (!tunnel.detached) continue;
      tunnels++;
      connections += tunnel.stats().connections;
    }
    return { tunnels, connections };
  }

  /** The tunnels waiting for a resume now, with whose they are (the admin port's /status; no token). */
  detachedTunnels(): { tunnel: Tunnel; credential: AgentCredential; agentID: string }[] {
    const out: { tunnel: Tunnel; credential: AgentCredential; agentID: string }[] = [];
    for (const { tunnel, credential, agentID } of this.byToken.values()) if (tunnel.detached) out.push({ tunnel, credential, agentID });
    return out;
  }

  /** Bytes all of them keep for a replay (O(connections): for metrics). */
  retainedBytes(): number {
    let n = 0;
    for (const { tunnel } of this.byToken.values()) n += tunnel.retainedBytes();
    return n;
  }

  slabBytes(): number {
    return sentBytesSlabs.bytes;
  }

  /**
   * A new stream of this credential and agentID comes from another agent
   * process (`incarnation`): the one that held the detached tunnels is gone,
   * so their connections are closed now rather than at the timeout.
   */
  closeDetachedOf(credential: AgentCredential, agentID: string, incarnation: string): number {
    let n = 0;
    for (const e of [...this.byToken.values()]) {
      if (e.credentialKey !== credential.key || e.agentID !== agentID || !e.tunnel.detached || e.incarnation === incarnation) continue;
      e.tunnel.close(new Error('the agent restarted: a new process of it connected'));
      n++;
    }
    return n;
  }

  /** Closes every detached tunnel (the tenant or server is closing). */
  closeDetached(why?: Error): void {
    for (const { tunnel } of [...this.byToken.values()]) if (tunnel.detached) tunnel.close(why);
  }

  /** Keeps the credential's detached tunnels within bounds: the oldest go first (Map order is age). */
  private bound(credentialKey: string): void {
    const waiting = [...this.byToken.values()].filter((e) => e.credentialKey === credentialKey && e.tunnel.detached);
    for (const e of waiting.slice(0, Math.max(0, waiting.length - this.maxDetachedPerCredential)))
      e.tunnel.close(new Error('too many detached tunnels of this credential; the oldest is not resumed'));
  }
}
