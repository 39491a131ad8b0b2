/**
 * One `clients:` entry as the server runs it (docs/frontends.md, "Clients"):
 * how the client is recognised, and what it may reach. Built by
 * config/clients-config.ts, which checks the text and reads the token files;
 * the policy (client-policy.ts) only reads these.
 */

/** Ports `from`..`to`, both included. */
export interface PortRange {
  readonly from: number;
  readonly to: number;
}

/** An IP network: `address/prefix` of one family. */
export interface Cidr {
  readonly address: string;
  readonly prefix: number;
  readonly family: 'ipv4' | 'ipv6';
}

/**
 * One destination rule; `text` is how the entry wrote it, for messages.
 * A `service` is written `ns/name` and held as its two names
 * (`name.ns.svc`, `name.ns.svc.cluster.local`).
 */
export type ClientRule =
  | { readonly kind: 'cidr'; readonly cidr: Cidr; readonly ports?: PortRange; readonly text: string }
  | {
      readonly kind: 'names';
      /** Lower case, no trailing dot; `*.rest` matches one or more labels before `rest`. */
      readonly names: readonly string[];
      readonly ports?: PortRange;
      readonly text: string;
    };

/** A client's own limits (client-quota.ts); absent: only the tenant's. */
export interface ClientLimits {
  readonly connections?: number;
  readonly pendingDials?: number;
  readonly dialRate?: number;
  readonly dialBurst?: number;
}

export interface ClientEntry {
  /** A DNS label: the name in logs, metrics' `client` label and audit records. */
  readonly name: string;
  /** The client certificate's subject, exactly as oneLine() renders it. */
  readonly subject?: string;
  /** A bearer token TokenReview authenticates as system:serviceaccount:<namespace>:<name>. */
  readonly serviceAccount?: { readonly namespace: string; readonly name: string };
  /** A static bearer token: the file it was read from, and the SHA-256 of its contents (compared in constant time). */
  readonly token?: { readonly file: string; readonly digest: Buffer };
  /** A Unix socket peer's uid (SO_PEERCRED). */
  readonly uid?: number;
  /** 'all': everything, as the kube-apiserver; else the rules (none: nothing). */
  readonly allow: 'all' | readonly ClientRule[];
  readonly limits?: ClientLimits;
}

/** The checked entry before its token file is read (config/clients-config.ts). */
export type ClientSpec = Omit<ClientEntry, 'token'> & { readonly tokenFile?: string };
