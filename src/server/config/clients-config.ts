/**
 * The `clients:` list (docs/frontends.md, "Clients"): each frontend client's
 * identity and the destinations it may reach, from a tenants file's entry
 * (tenants-file.ts) or, for a server of one cluster, the YAML file of
 * --frontend-clients-config. Checked whole: every mistake is named with its
 * entry and key and what to write instead; then the token files are read
 * (loadClients) so a running policy never touches the disk.
 */
import fs from 'node:fs';
import net from 'node:net';
import { errorMessage } from '../../common/error-message.js';
import { UsageError } from '../../common/usage-error.js';
import { CredentialFileError, loadToken } from '../../common/credential-files.js';
import type { Cidr, ClientEntry, ClientLimits, ClientRule, ClientSpec, PortRange } from '../clients/client-entry.js';
import { KAS_CLIENT_NAME } from '../clients/kas-only-clients.js';
import { tokenDigestOf } from '../clients/token-digest.js';
import { keyOf } from '../../settings/flag-names.js';
import { tenantSettings } from './tenant-settings.js';

/** Entries one list may hold: each dial scans them (admission is by index, the rules per client). */
export const MAX_CLIENTS = 1000;
/** Rules one entry may hold. */
export const MAX_RULES = 1000;
/** Largest --frontend-clients-config file read. */
export const MAX_CLIENTS_FILE_BYTES = 4 * 1024 * 1024;

const ENTRY_KEYS = ['name', 'subject', 'service-account', 'token-file', 'uid', 'allow', 'limits'] as const;
const RULE_KEYS = ['cidr', 'name', 'service', 'port'] as const;
const DIAL_RATE = keyOf(tenantSettings, 'dial-rate');
const LIMIT_KEYS = {
  connections: 'connections',
  'pending-dials': 'pendingDials',
  // A client's rate is spelt as a tenant's (tenant-settings.ts), which it divides.
  [DIAL_RATE]: 'dialRate',
  [keyOf(tenantSettings, 'dial-burst')]: 'dialBurst',
} as const;

/** Lowercase DNS label (RFC 1123). */
const LABEL = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;
/** A DNS subdomain (RFC 1123), as Kubernetes names a service account. */
const SUBDOMAIN = /^(?=.{1,253}$)[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$/;
/** One label of a destination name: letters, digits, '-' and '_' (SRV-style names), at most 63. */
const NAME_LABEL = /^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$/;

/** What the checks need to know of where the list is. */
export interface ClientsContext {
  /** Whether bearer tokens can be reviewed (TokenReview): else a `service-account` entry is a mistake. */
  tokenReview: boolean;
  /** What to configure for token review, in the words of the list's source (flags or tenants-file keys). */
  tokenReviewHint: string;
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

const show = (v: unknown): string => JSON.stringify(v) ?? String(v);

/** `clients[2] "prometheus"`, or `clients[2]` before its name is known. */
function entryName(i: number, name: unknown): string {
  return typeof name === 'string' && name !== '' ? `clients[${i}] ${JSON.stringify(name)}` : `clients[${i}]`;
}

/** `1-65535`, `"9100"` or `"9100-9110"` as a range; throws a message saying what to write. */
export function parsePorts(v: unknown): PortRange {
  const bad = `port ${show(v)}: want a port 1-65535, or a range such as "9100-9110"`;
  if (typeof v === 'number') {
    if (!Number.isInteger(v) || v < 1 || v > 65535) throw new Error(bad);
    return { from: v, to: v };
  }
  if (typeof v !== 'string') throw new Error(bad);
  const m = /^\s*(\d{1,5})\s*(?:-\s*(\d{1,5})\s*)?$/.exec(v);
  if (!m) throw new Error(bad);
  const from = Number(m[1]);
  const to = m[2] === undefined ? from : Number(m[2]);
  if (from < 1 || to > 65535 || from > to) throw new Error(bad);
  return { from, to };
}

/** `10.0.0.0/8`, `fd00::/8`, or one address (a /32 or /128). */
export function parseCidr(v: unknown): Cidr {
  const want = 'want an IPv4 or IPv6 network such as 10.0.0.0/8 or fd00::/8, or one address';
  if (typeof v !== 'string') throw new Error(`cidr ${show(v)}: ${want}`);
  const [address, prefixText, ...rest] = v.trim().split('/');
  const version = net.isIP(address);
  if (version === 0 || rest.length > 0) throw new Error(`cidr ${show(v)}: ${want}`);
  const max = version === 4 ? 32 : 128;
  if (prefixText !== undefined && !/^\d{1,3}$/.test(prefixText)) throw new Error(`cidr ${show(v)}: the prefix length is a number 0-${max}`);
  const prefix = prefixText === undefined ? max : Number(prefixText);
  if (prefix > max) throw new Error(`cidr ${show(v)}: an IPv${version} prefix is at most /${max}`);
  return { address, prefix, family: version === 4 ? 'ipv4' : 'ipv6' };
}

/** A destination name or `*.`-pattern, normal (lower case, no trailing dot); throws what to write. */
export function parseNamePattern(v: unknown): string {
  const want = 'want a DNS name such as metrics.example.com, or "*." and a name (*.svc.cluster.local: one or more labels before it)';
  if (typeof v !== 'string' || v === '') throw new Error(`name ${show(v)}: ${want}`);
  let name = v.toLowerCase();
  if (name.endsWith('.')) name = name.slice(0, -1);
  if (net.isIP(name) !== 0) throw new Error(`name ${show(v)} is an IP address: write it as cidr: ${v}`);
  const wild = name.startsWith('*.');
  const rest = wild ? name.slice(2) : name;
  if (rest.length === 0 || rest.length > 253 || !rest.split('.').every((l) => NAME_LABEL.test(l)))
    throw new Error(`name ${show(v)}: ${want}`);
  return name;
}

/** `ns/name`: a Service's two names in the cluster. */
export function parseService(v: unknown): { text: string; names: string[] } {
  const m = typeof v === 'string' ? /^([^/]+)\/([^/]+)$/.exec(v) : null;
  if (!m || !LABEL.test(m[1]) || !LABEL.test(m[2]))
    throw new Error(`service ${show(v)}: want namespace/name of a Service, e.g. monitoring/node-exporter (lowercase DNS labels)`);
  const [, ns, name] = m;
  return { text: `${ns}/${name}`, names: [`${name}.${ns}.svc`, `${name}.${ns}.svc.cluster.local`] };
}

function portText(ports: PortRange | undefined): string {
  if (!ports) return '';
  return ports.from === ports.to ? ` port ${ports.from}` : ` ports ${ports.from}-${ports.to}`;
}

function parseRule(v: unknown): ClientRule {
  if (!isRecord(v)) throw new Error(`want a mapping with one of cidr, name or service (and port), got ${show(v)}`);
  const unknown = Object.keys(v).filter((k) => !(RULE_KEYS as readonly string[]).includes(k));
  if (unknown.length > 0) throw new Error(`unknown key ${show(unknown[0])} (a rule has one of cidr, name, service, and port)`);
  const kinds = (['cidr', 'name', 'service'] as const).filter((k) => v[k] !== undefined);
  if (kinds.length !== 1)
    throw new Error(
      kinds.length === 0
        ? 'a rule needs one of cidr, name or service'
        : `a rule has one of cidr, name or service, not ${kinds.join(' and ')}`,
    );
  const ports = v.port === undefined ? undefined : parsePorts(v.port);
  const withPorts = ports ? { ports } : {};
  if (kinds[0] === 'cidr') {
    const cidr = parseCidr(v.cidr);
    return { kind: 'cidr', cidr, ...withPorts, text: `cidr ${cidr.address}/${cidr.prefix}${portText(ports)}` };
  }
  if (kinds[0] === 'name') {
    const name = parseNamePattern(v.name);
    return { kind: 'names', names: [name], ...withPorts, text: `name ${name}${portText(ports)}` };
  }
  const service = parseService(v.service);
  return { kind: 'names', names: service.names, ...withPorts, text: `service ${service.text}${portText(ports)}` };
}

function parseLimits(v: unknown, own: string[]): ClientLimits | undefined {
  if (!isRecord(v)) {
    own.push(`limits: want a mapping of ${Object.keys(LIMIT_KEYS).join(', ')}`);
    return undefined;
  }
  const limits: { -readonly [K in keyof ClientLimits]: ClientLimits[K] } = {};
  for (const [key, value] of Object.entries(v)) {
    if (!(key in LIMIT_KEYS)) {
      own.push(`limits: unknown key ${show(key)} (want ${Object.keys(LIMIT_KEYS).join(', ')})`);
      continue;
    }
    const min = key === DIAL_RATE ? 0 : 1;
    if (typeof value !== 'number' || !Number.isInteger(value) || value < min) {
      own.push(`limits: ${key} ${show(value)}: want a whole number, at least ${min}`);
      continue;
    }
    limits[LIMIT_KEYS[key as keyof typeof LIMIT_KEYS]] = value;
  }
  return limits;
}

/** One entry checked: its spec, or undefined with its mistakes in `own`. */
function checkEntry(entry: unknown, ctx: ClientsContext, own: string[]): ClientSpec | undefined {
  if (!isRecord(entry)) {
    own.push('want a mapping with name, a way to recognise the client (subject, service-account, token-file, uid) and allow');
    return undefined;
  }
  for (const key of Object.keys(entry))
    if (!(ENTRY_KEYS as readonly string[]).includes(key)) own.push(`unknown key ${show(key)} (an entry takes ${ENTRY_KEYS.join(', ')})`);
  const name = entry.name;
  if (typeof name !== 'string' || !LABEL.test(name))
    own.push(
      `name ${show(name)}: want a lowercase DNS label (a-z, 0-9, '-', at most 63): logs, metrics and audit records name the client by it`,
    );
  const spec: { -readonly [K in keyof ClientSpec]: ClientSpec[K] } = { name: typeof name === 'string' ? name : '', allow: [] };
  if (entry.subject !== undefined) {
    if (typeof entry.subject !== 'string' || entry.subject.trim() === '')
      own.push(`subject ${show(entry.subject)}: want the client certificate's subject as one line, e.g. "CN=prometheus, O=monitoring"`);
    else spec.subject = entry.subject;
  }
  if (entry['service-account'] !== undefined) {
    const sa = entry['service-account'];
    const m = typeof sa === 'string' ? /^([^/]+)\/([^/]+)$/.exec(sa) : null;
    if (!m || !LABEL.test(m[1]) || !SUBDOMAIN.test(m[2]))
      own.push(`service-account ${show(sa)}: want namespace/name, e.g. monitoring/prometheus`);
    else if (!ctx.tokenReview)
      own.push(`service-account ${show(sa)}: its tokens are checked by TokenReview, which needs ${ctx.tokenReviewHint}; or use token-file`);
    else spec.serviceAccount = { namespace: m[1], name: m[2] };
  }
  if (entry['token-file'] !== undefined) {
    const f = entry['token-file'];
    if (typeof f !== 'string' || f === '') own.push(`token-file ${show(f)}: want the path of a file holding the client's bearer token`);
    else spec.tokenFile = f;
  }
  if (entry.uid !== undefined) {
    const uid = entry.uid;
    if (typeof uid !== 'number' || !Number.isInteger(uid) || uid < 0 || uid > 0xfffffffe)
      own.push(`uid ${show(uid)}: want the numeric user ID of the process on the Unix socket's other end`);
    else spec.uid = uid;
  }
  if (['subject', 'service-account', 'token-file', 'uid'].every((k) => entry[k] === undefined))
    own.push('nothing recognises this client: give subject, service-account, token-file or uid');
  const allow = entry.allow ?? (name === KAS_CLIENT_NAME ? 'all' : []);
  if (allow === 'all') spec.allow = 'all';
  else if (!Array.isArray(allow)) own.push(`allow ${show(allow)}: want "all" or a list of rules (cidr, name, service; port)`);
  else if (allow.length > MAX_RULES) own.push(`allow: ${allow.length} rules; at most ${MAX_RULES}`);
  else {
    const rules: ClientRule[] = [];
    allow.forEach((r: unknown, j) => {
      try {
        rules.push(parseRule(r));
      } catch (err) {
        own.push(`allow[${j}]: ${errorMessage(err)}`);
      }
    });
    spec.allow = rules;
  }
  if (entry.limits !== undefined) {
    const limits = parseLimits(entry.limits, own);
    if (limits) spec.limits = limits;
  }
  return own.length > 0 ? undefined : spec;
}

/** What no two entries may share: a name, a subject, a uid, a service account, a token file. */
function checkAcross(specs: readonly ClientSpec[], mistakes: string[]): void {
  const claims = new Map<string, string>();
  const claim = (what: string, value: string | undefined, owner: string): void => {
    if (value === undefined) return;
    const key = `${what}\n${value}`;
    const first = claims.get(key);
    if (first === undefined) claims.set(key, owner);
    else if (what === 'name') mistakes.push(`client ${JSON.stringify(owner)} is declared more than once: names are unique`);
    else mistakes.push(`client ${JSON.stringify(owner)}: ${what} ${JSON.stringify(value)} is already client ${JSON.stringify(first)}'s`);
  };
  for (const s of specs) {
    claim('name', s.name, s.name);
    claim('subject', s.subject, s.name);
    claim('uid', s.uid === undefined ? undefined : String(s.uid), s.name);
    claim('service-account', s.serviceAccount && `${s.serviceAccount.namespace}/${s.serviceAccount.name}`, s.name);
    claim('token-file', s.tokenFile, s.name);
  }
}

/** Checks a `clients:` value (the parsed YAML); every mistake is a line naming its entry and key. */
export function checkClients(value: unknown, ctx: ClientsContext): { specs: ClientSpec[]; mistakes: string[] } {
  if (value === undefined || value === null) return { specs: [], mistakes: [] };
  if (!Array.isArray(value))
    return { specs: [], mistakes: ['clients: want a list of client entries (name, subject/uid/token-file/service-account, allow)'] };
  const mistakes: string[] = [];
  if (value.length > MAX_CLIENTS) mistakes.push(`clients: ${value.length} entries; at most ${MAX_CLIENTS}`);
  const specs: ClientSpec[] = [];
  value.slice(0, MAX_CLIENTS).forEach((entry: unknown, i) => {
    const own: string[] = [];
    const spec = checkEntry(entry, ctx, own);
    const at = entryName(i, isRecord(entry) ? entry.name : undefined);
    mistakes.push(...own.map((m) => `${at}: ${m}`));
    if (spec) specs.push(spec);
  });
  checkAcross(specs, mistakes);
  return { specs, mistakes };
}

/** Reads each entry's token file; a file that cannot be read, or is empty, is a mistake naming the entry. `where` prefixes messages (a tenant). */
export function loadClients(specs: readonly ClientSpec[], where = ''): { entries: ClientEntry[]; mistakes: string[] } {
  const mistakes: string[] = [];
  const entries: ClientEntry[] = [];
  const digests = new Map<string, string>();
  for (const spec of specs) {
    const { tokenFile, ...rest } = spec;
    if (tokenFile === undefined) {
      entries.push(rest);
      continue;
    }
    const at = `${where}client ${JSON.stringify(spec.name)}`;
    try {
      const digest = tokenDigestOf(loadToken({ flag: 'token-file', path: tokenFile, where: at }));
      const first = digests.get(digest.toString('hex'));
      if (first !== undefined) mistakes.push(`${at}: token-file ${tokenFile} holds the same token as client ${JSON.stringify(first)}'s`);
      digests.set(digest.toString('hex'), spec.name);
      entries.push({ ...rest, token: { file: tokenFile, digest } });
    } catch (err) {
      mistakes.push(err instanceof CredentialFileError ? err.message : `${at}: token-file ${tokenFile}: ${errorMessage(err)}`);
    }
  }
  return { entries, mistakes };
}

/** A --frontend-clients-config file with mistakes (exit 2): every mistake, one line each. */
export class ClientsFileError extends UsageError {
  override name = 'ClientsFileError';
  constructor(
    readonly flag: string,
    readonly file: string,
    readonly mistakes: readonly string[],
  ) {
    super(
      mistakes.length === 1
        ? `${flag} ${file}: ${mistakes[0]}`
        : `${flag} ${file}: ${mistakes.length} mistakes:\n  ${mistakes.join('\n  ')}`,
    );
  }
}

/**
 * Reads --frontend-clients-config (`flag`): a YAML mapping with a `clients:`
 * list, checked, its token files read; throws ClientsFileError listing every mistake.
 */
export async function readClientsFile(flag: string, file: string, ctx: ClientsContext): Promise<ClientEntry[]> {
  let text: string;
  try {
    const size = fs.statSync(file).size;
    if (size > MAX_CLIENTS_FILE_BYTES) throw new Error(`${size} bytes; at most ${MAX_CLIENTS_FILE_BYTES} are read`);
    text = fs.readFileSync(file, 'utf8');
  } catch (err) {
    throw new ClientsFileError(flag, file, [`cannot read: ${errorMessage(err)}`]);
  }
  const { parseDocument } = await import('yaml');
  const doc = parseDocument(text, { uniqueKeys: true });
  if (doc.errors.length > 0) throw new ClientsFileError(flag, file, [`not YAML: ${doc.errors[0].message.split('\n')[0]}`]);
  const root: unknown = doc.toJS({ maxAliasCount: 100 });
  if (!isRecord(root)) throw new ClientsFileError(flag, file, ['want a mapping with a clients: list']);
  const mistakes: string[] = [];
  for (const key of Object.keys(root)) if (key !== 'clients') mistakes.push(`unknown key ${show(key)} (the file holds clients:)`);
  if (root.clients === undefined) mistakes.push('no clients: list (without one, leave the flag out: the kube-apiserver alone may dial)');
  const checked = checkClients(root.clients, ctx);
  mistakes.push(...checked.mistakes);
  if (mistakes.length > 0) throw new ClientsFileError(flag, file, mistakes);
  const loaded = loadClients(checked.specs);
  if (loaded.mistakes.length > 0) throw new ClientsFileError(flag, file, loaded.mistakes);
  return loaded.entries;
}
