/**
 * `kanal status [--admin-address host:port] [--tenant T] [--agent ID] [--limit N] [-o text|json]`:
 * what a server or agent on this host holds now, from its admin port's /status
 * (domain/status-document.ts; docs/operations.md, "What is connected: `kanal status`").
 * Without --admin-address it asks the server's default admin port, then the agent's.
 * A server answers a page of its agents at a time: the pages are fetched in
 * turn and shown as one document.
 */
import http from 'node:http';
import type { Argv, InferredOptionTypes } from 'yargs';
import { formatHostPort, parseHostPort, type HostPort } from '../common/host-port.js';
import { UsageError } from '../common/usage-error.js';
import { errorMessage } from '../common/error-message.js';
import { STATUS_KIND, STATUS_PATH, STATUS_VERSION, type StatusDocument } from '../domain/status-document.js';
import { formatStatus, formatStatusJson } from './status-format.js';
import { MAX_STATUS_LIMIT, statusQueryString, type StatusQuery } from '../domain/status-query.js';
import { FLAG as AGENT_FLAG } from '../agent/settings.js';
import { FLAG as SERVER_FLAG } from '../server/config/settings.js';

/** Upstream's admin ports (server --admin-port, agent --admin-server-port), asked in this order. */
export const DEFAULT_ADMIN_ADDRESSES: readonly { address: HostPort; what: string }[] = [
  { address: { host: '127.0.0.1', port: 8095 }, what: "the server's default admin port" },
  { address: { host: '127.0.0.1', port: 8094 }, what: "the agent's default admin port" },
];

/** A page is at most about 1 MiB (MAX_STATUS_PAGE_BYTES); an answer larger than this is not one. */
const MAX_STATUS_BYTES = 16 * 1024 * 1024;
/** Pages fetched for one `kanal status` at most: a million agents at the largest page. */
const MAX_PAGES = 1000;
/** Longest piece of a non-Kanal answer quoted in an error. */
const QUOTED_CHARS = 120;

export const statusFlags = {
  'admin-address': {
    type: 'string',
    describe:
      'The admin port to ask, host:port (default: 127.0.0.1:8095, the server, then 127.0.0.1:8094, the agent). ' +
      `A server sets it with ${SERVER_FLAG['admin-bind-address']} and ${SERVER_FLAG['admin-port']}, an agent with ${AGENT_FLAG['admin-bind-address']} and ${AGENT_FLAG['admin-server-port']}`,
  },
  output: { alias: 'o', choices: ['text', 'json'] as const, default: 'text' as const, describe: 'Output format' },
  timeout: { type: 'number', default: 5, describe: 'Seconds to wait for each answer' },
  tenant: { type: 'string', describe: `A server's agents of this tenant only (${SERVER_FLAG['tenants-config']})` },
  agent: { type: 'string', describe: "A server's agents of this agentID only" },
  limit: { type: 'number', describe: "Show at most this many of a server's agents (default: every agent, fetched a page at a time)" },
} as const;

export type StatusArgs = InferredOptionTypes<typeof statusFlags>;

export function statusBuilder(y: Argv): Argv<StatusArgs> {
  return y
    .options(statusFlags)
    .example('$0 status', 'What the server (or else the agent) on this host holds now')
    .example('$0 status --admin-address 127.0.0.1:9095 -o json', 'The status document of the admin port on 9095, as JSON')
    .example(
      '$0 status --tenant alpha --limit 20',
      "The first 20 agents of tenant alpha (a server's agents are sorted by tenant and agentID)",
    );
}

/** Nothing listens there: the next default address is tried. */
class NotListening extends Error {}

/** Fetches and checks the document at `address`; throws with what to fix. */
export async function fetchStatus(address: HostPort, timeoutMs: number, query: Partial<StatusQuery> = {}): Promise<StatusDocument> {
  const where = formatHostPort(address);
  const qs = statusQueryString(query);
  const { status, body, contentType } = await get(address, `${STATUS_PATH}${qs ? `?${qs}` : ''}`, timeoutMs);
  if (status === 403) throw new Error(`${where} refused the status: ${firstLine(body)}`);
  if (status === 400) throw new Error(`${where} refused the query: ${firstLine(body)}`);
  if (status === 501) throw new Error(`${where} serves no status: ${firstLine(body)}`);
  if (status !== 200) {
    throw new Error(
      `${where} answered HTTP ${status} for ${STATUS_PATH} (${quote(body)}): not the admin port of a Kanal that serves its status; ` +
        'check --admin-address (a server started with --workers serves none on its primary), or run the kanal of the same release as the process',
    );
  }
  let doc: unknown;
  try {
    doc = JSON.parse(body);
  } catch {
    throw new Error(
      `${where} is not a Kanal admin port: its ${STATUS_PATH} is not JSON (${contentType || 'no content type'}: ${quote(body)})`,
    );
  }
  if (!isObject(doc) || doc.kind !== STATUS_KIND) {
    throw new Error(
      `${where} is not a Kanal admin port: its ${STATUS_PATH} is JSON but not a Kanal status document (no "kind": "${STATUS_KIND}")`,
    );
  }
  if (doc.version !== STATUS_VERSION) {
    throw new Error(
      `${where} serves status version ${JSON.stringify(doc.version)}; this kanal reads version ${STATUS_VERSION}: ` +
        'run the kanal of the same release as the process, or use -o json with a kanal that knows it',
    );
  }
  if (doc.component !== 'server' && doc.component !== 'agent') {
    throw new Error(`${where} serves a status document of an unknown component ${JSON.stringify(doc.component)}`);
  }
  return doc as unknown as StatusDocument;
}

export async function runStatus(args: StatusArgs): Promise<void> {
  const timeoutMs = Math.round(args.timeout * 1000);
  if (!Number.isFinite(timeoutMs) || timeoutMs < 1 || timeoutMs > 600_000)
    throw new UsageError(`--timeout must be a number of seconds above 0 and at most 600, got ${args.timeout}`);
  const given = args['admin-address'];
  let candidates: { address: HostPort; what: string }[];
  if (given !== undefined) {
    let address: HostPort;
    try {
      address = parseHostPort(given);
    } catch (err) {
      throw new UsageError(`--admin-address: ${errorMessage(err)}`);
    }
    candidates = [{ address, what: '--admin-address' }];
  } else {
    candidates = [...DEFAULT_ADMIN_ADDRESSES];
  }
  let limit: number | undefined;
  if (args.limit !== undefined) {
    if (!Number.isInteger(args.limit) || args.limit < 1) throw new UsageError(`--limit must be a whole number above 0, got ${args.limit}`);
    limit = args.limit;
  }
  const filter = {
    ...(args.tenant !== undefined ? { tenant: args.tenant } : {}),
    ...(args.agent !== undefined ? { agent: args.agent } : {}),
  };
  const doc = await findStatus(candidates, timeoutMs, { filter, ...(limit !== undefined ? { limit } : {}) });
  if (doc.component === 'server' && doc.page.matched > doc.agents.length)
    process.stderr.write(`showing ${doc.agents.length} of ${doc.page.matched} agent(s)${limit !== undefined ? ' (--limit)' : ''}\n`);
  process.stdout.write(args.output === 'json' ? `${formatStatusJson(doc)}\n` : `${formatStatus(doc)}\n`);
}

/**
 * The document of the first of `candidates` where something listens; an
 * answer there that is not a status ends the search (it is the port asked
 * for, and says what is wrong). `what` names each in the error.
 */
export async function findStatus(
  candidates: readonly { address: HostPort; what: string }[],
  timeoutMs: number,
  ask: StatusAsk = { filter: {} },
): Promise<StatusDocument> {
  const silent: string[] = [];
  for (const { address, what } of candidates) {
    try {
      return await fetchAllPages(address, timeoutMs, ask);
    } catch (err) {
      if (!(err instanceof NotListening)) throw err;
      silent.push(`${formatHostPort(address)} (${what}): ${err.message}`);
    }
  }
  throw new Error(
    `no Kanal admin port answers: ${silent.join('; ')}. ` +
      'Is a kanal server or agent running on this host with its admin port on? Name its address with --admin-address host:port',
  );
}

/** Which of a server's agents to show: `limit` at most (default every one). */
export interface StatusAsk {
  filter: { tenant?: string; agent?: string };
  limit?: number;
}

/**
 * A server's pages from the first to the last (or until `ask.limit` agents),
 * as one document: the first page's header, every page's agents. The pages
 * are cut from snapshots up to a second apart; each agent shows once.
 */
async function fetchAllPages(address: HostPort, timeoutMs: number, ask: StatusAsk): Promise<StatusDocument> {
  const pageLimit = (shown: number): number => Math.min(MAX_STATUS_LIMIT, ask.limit === undefined ? MAX_STATUS_LIMIT : ask.limit - shown);
  const first = await fetchStatus(address, timeoutMs, { ...ask.filter, limit: pageLimit(0) });
  if (first.component !== 'server') return first;
  let next = first.page.next;
  for (let pages = 1; next !== undefined && (ask.limit === undefined || first.agents.length < ask.limit); pages++) {
    if (pages >= MAX_PAGES)
      throw new Error(`${formatHostPort(address)} has more than ${MAX_PAGES} pages of agents: narrow it with --tenant, --agent or --limit`);
    const page = await fetchStatus(address, timeoutMs, { ...ask.filter, limit: pageLimit(first.agents.length), after: next });
    if (page.component !== 'server') throw new Error(`${formatHostPort(address)} answered a page with an agent's document`);
    first.agents.push(...page.agents);
    first.page.matched = page.page.matched;
    next = page.page.next;
  }
  if (next === undefined) delete first.page.next;
  else first.page.next = next;
  return first;
}

function get(address: HostPort, path: string, timeoutMs: number): Promise<{ status: number; body: string; contentType: string }> {
  return new Promise((resolve, reject) => {
    const req = http.get({ host: address.host, port: address.port, path, timeout: timeoutMs, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      let size = 0;
      res.on('data', (chunk: Buffer) => {
        size += chunk.length;
        if (size > MAX_STATUS_BYTES) {
          req.destroy(new Error(`its answer is over ${MAX_STATUS_BYTES / 1024 / 1024} MiB: not a status document`));
          return;
        }
        chunks.push(chunk);
      });
      res.on('end', () =>
        resolve({
          status: res.statusCode ?? 0,
          body: Buffer.concat(chunks).toString('utf8'),
          contentType: res.headers['content-type'] ?? '',
        }),
      );
      res.on('error', reject);
    });
    req.on('timeout', () => req.destroy(new Error(`no answer within ${timeoutMs / 1000} s`)));
    req.on('error', (err: NodeJS.ErrnoException) => {
      // Nobody there (or nothing routes there): the caller may try the next default address.
      if (err.code === 'ECONNREFUSED' || err.code === 'EADDRNOTAVAIL') reject(new NotListening('nothing listens there'));
      else reject(new Error(`${formatHostPort(address)}: ${err.message}`));
    });
  });
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function firstLine(text: string): string {
  return text.split('\n', 1)[0].slice(0, 600);
}

function quote(text: string): string {
  const t = text.replace(/\s+/g, ' ').trim();
  return JSON.stringify(t.length > QUOTED_CHARS ? `${t.slice(0, QUOTED_CHARS)}…` : t);
}
