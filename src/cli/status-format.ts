/**
 * `kanal status` as a person reads it: a header, then tables (agents and
 * their tunnels on a server; addresses, tunnels, node listeners and the host
 * interface on an agent), ages as "3m12s", bytes as "1.2 MiB". Columns are
 * described in docs/operations.md, "What is connected: `kanal status`".
 * Every string of the document (agentIDs, credentials, error texts a peer
 * chose) is escaped for the terminal before it is laid out, in the tables
 * and in JSON alike (terminal-text.ts).
 */
import { escapeStringsForTerminal, jsonForTerminal } from '../common/terminal-text.js';
import type { AgentStatusDocument, PerDirection, ServerStatusDocument, StatusDocument, TunnelStatus } from '../domain/status-document.js';
import type { RecentCounts, WindowCounts } from '../domain/recent-events.js';

/** Longest cell shown (a certificate subject with its issuer can be long); `-o json` has it whole. */
const MAX_CELL = 64;

/** "45s", "3m12s", "2h05m", "3d04h". */
export function formatAge(seconds: number): string {
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, '0')}s`;
  if (s < 86_400) return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, '0')}m`;
  return `${Math.floor(s / 86_400)}d${String(Math.floor((s % 86_400) / 3600)).padStart(2, '0')}h`;
}

const UNITS = ['KiB', 'MiB', 'GiB', 'TiB', 'PiB'];

/** "512 B", "1.2 MiB" (powers of 1024). */
export function formatBytes(bytes: number): string {
  if (bytes < 1024) return `${bytes} B`;
  let v = bytes / 1024;
  let unit = 0;
  while (v >= 1024 && unit < UNITS.length - 1) {
    v /= 1024;
    unit++;
  }
  return `${v < 10 ? v.toFixed(1) : Math.round(v)} ${UNITS[unit]}`;
}

/** Columns padded to their widest cell, two spaces apart; the last column is not padded. */
export function table(header: readonly string[], rows: readonly (readonly string[])[]): string {
  const cells = [header, ...rows].map((r) => r.map((c) => (c.length > MAX_CELL ? `${c.slice(0, MAX_CELL - 1)}…` : c)));
  const widths = header.map((_, i) => Math.max(...cells.map((r) => (r[i] ?? '').length)));
  return cells
    .map((r) =>
      r
        .map((c, i) => (i === r.length - 1 ? c : c.padEnd(widths[i])))
        .join('  ')
        .trimEnd(),
    )
    .join('\n');
}

export function formatStatus(raw: StatusDocument): string {
  // Escaped before the widths are measured, so the columns line up as printed.
  const doc = escapeStringsForTerminal(raw);
  return doc.component === 'server' ? formatServer(doc) : formatAgent(doc);
}

/** `-o json`: the document as it came, with what a terminal would act on written as \uXXXX (it parses back the same). */
export function formatStatusJson(doc: StatusDocument): string {
  return jsonForTerminal(doc, 2);
}

function processLine(doc: StatusDocument): string {
  const p = doc.process;
  return `version ${p.version} (commit ${p.commit}), pid ${p.pid}, up ${formatAge(p.uptimeSeconds)}, at ${doc.generatedAt}`;
}

/** "open", "open, draining", "detached 12s", "open, read paused". */
function tunnelState(t: TunnelStatus): string {
  const parts = [t.state === 'detached' && t.detachedSeconds !== undefined ? `detached ${formatAge(t.detachedSeconds)}` : t.state];
  if (t.peerDraining) parts.push('draining');
  if (t.readPaused) parts.push('read paused');
  return parts.join(', ');
}

const both = (d: PerDirection): string => `${d.cpToNode}/${d.nodeToCp}`;

/** Refusals of one tunnel over the last 1/5/15 minutes, all reasons together: "0/2/2". */
function refusedTotals(r: RecentCounts): string {
  const sum = (w: '1m' | '5m' | '15m'): number => Object.values(r.refusals).reduce((n, c) => n + c[w], 0);
  return `${sum('1m')}/${sum('5m')}/${sum('15m')}`;
}

function recentSection(r: RecentCounts): string {
  const rows = (part: Partial<Record<string, WindowCounts>>, kind: string): string[][] =>
    Object.entries(part)
      .flatMap(([reason, w]) => (w ? [[kind, reason, String(w['1m']), String(w['5m']), String(w['15m'])]] : []))
      .sort((a, b) => Number(b[4]) - Number(a[4]) || a[1].localeCompare(b[1]));
  const all = [...rows(r.refusals, 'refused'), ...rows(r.throttles, 'throttled')];
  if (all.length === 0) return 'Refusals and throttling: none in the last 15 minutes.';
  return `Refusals and throttling, last 1, 5 and 15 minutes:\n${table(['WHAT', 'REASON', '1M', '5M', '15M'], all)}`;
}

function formatServer(doc: ServerStatusDocument): string {
  const s = doc.server;
  const head = [
    `Kanal server ${s.serverID} (${s.state}, one of ${s.serverCount} server(s))`,
    processLine(doc),
    ...(s.tenants ? [`tenants: ${s.tenants.length > 0 ? s.tenants.join(', ') : 'none'}`] : []),
  ];
  const tunnels = doc.agents.reduce((n, a) => n + a.tunnels.length, 0);
  const rows = doc.agents.flatMap((a) =>
    a.tunnels.map((t) => [
      a.agentID,
      ...(s.tenants ? [a.tenant ?? ''] : []),
      a.credential,
      t.peer || '-',
      formatAge(t.ageSeconds),
      tunnelState(t),
      t.liveness
        ? `${t.liveness.quiet ? 'QUIET' : 'ok'}${t.liveness.lastAnswerSecondsAgo !== undefined ? ` ${formatAge(t.liveness.lastAnswerSecondsAgo)} ago` : ''}`
        : '-',
      t.features.join(',') || 'none',
      both(t.connections),
      both(t.pendingDials),
      `${formatBytes(t.bytes.toPeer)} / ${formatBytes(t.bytes.fromPeer)}`,
      refusedTotals(t.recent),
    ]),
  );
  const header = [
    'AGENT',
    ...(s.tenants ? ['TENANT'] : []),
    'CREDENTIAL',
    'PEER',
    'AGE',
    'STATE',
    'PING',
    'FEATURES',
    'CONNS CP>N/N>CP',
    'PENDING CP>N/N>CP',
    'BYTES TO/FROM AGENT',
    'REFUSED 1M/5M/15M',
  ];
  const agents = rows.length === 0 ? 'No agent connected.' : `${doc.agents.length} agent(s), ${tunnels} tunnel(s):\n${table(header, rows)}`;
  return [head.join('\n'), agents, recentSection(doc.recent)].join('\n\n');
}

function formatAgent(doc: AgentStatusDocument): string {
  const a = doc.agent;
  const head = [
    `Kanal agent ${a.agentID} (${a.state}, aiming at ${a.expectedServers.count} server(s): ${a.expectedServers.from})`,
    processLine(doc),
  ];
  const servers = `Server addresses:\n${table(
    ['ADDRESS', 'NAME', 'STATE', 'SERVER IDS', 'LAST ERROR'],
    doc.servers.map((s) => [s.address, s.name, s.state, s.serverIDs.join(',') || '-', s.lastError ?? '']),
  )}`;
  const tunnels =
    doc.tunnels.length === 0
      ? 'No tunnel up.'
      : `Tunnels:\n${table(
          ['SERVER ID', 'ADDRESS', 'AGE', 'STATE', 'FEATURES', 'CONNS CP>N/N>CP', 'PENDING CP>N/N>CP', 'BYTES TO/FROM SERVER'],
          doc.tunnels.map((t) => [
            t.serverID,
            t.address,
            formatAge(t.ageSeconds),
            tunnelState(t),
            t.features.join(',') || 'none',
            both(t.connections),
            both(t.pendingDials),
            `${formatBytes(t.bytes.toPeer)} / ${formatBytes(t.bytes.fromPeer)}`,
          ]),
        )}`;
  const sections = [head.join('\n'), servers, tunnels];
  const nl = doc.nodeListeners;
  if (nl) {
    sections.push(
      `Node listeners (node -> control plane, ${nl.listening ? 'accepting' : 'not accepting'}; ${nl.active} connection(s) carried, ${nl.waiting} waiting for a tunnel):\n` +
        table(
          ['LISTEN', 'DESTINATION'],
          nl.targets.map((t) => [t.listen, t.destination]),
        ),
    );
  }
  const hi = doc.hostInterface;
  if (hi) {
    const what = hi.type === 'none' ? `none (${hi.address} on an existing interface)` : `${hi.name} (${hi.type}) with ${hi.address}`;
    sections.push(`Host interface: ${what}: ${hi.ready ? 'ready' : 'NOT READY'} (${hi.detail})`);
  }
  sections.push(recentSection(doc.recent));
  return sections.join('\n\n');
}
