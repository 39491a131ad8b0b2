/**
 * Bench worker of section 8 (suite-reconnect.ts), one process per role so the
 * driver carries no traffic and the relay's event loop is not the clients':
 * - relays: the round-robin balancer in front of HA servers and the cuttable
 *   relay between an agent and its server (relay.ts);
 * - counter streams: tunnelled connections (HTTP CONNECT over a server's Unix
 *   socket to the backend's echo service), each writing a numbered line every
 *   intervalMs and checking the echo line by line, so a byte lost, duplicated
 *   or corrupted across a tunnel cut is counted, and the first echo after the
 *   restore is timed per connection.
 * Times cross processes as epoch milliseconds (performance.timeOrigin + now()).
 */
import net from 'node:net';
import { serveCommands } from './rpc.js';
import { Relay, type RelayStats } from './relay.js';
import { errorMessage } from '../src/common/error-message.js';
import { connectUnix, httpConnect } from '../kit/demo/proxy-client.js';

const epochMs = (): number => performance.timeOrigin + performance.now();

/** Bytes of line `seq` ("<seq>\n"). */
const lineBytes = (seq: number): number => String(seq).length + 1;

/** Bytes of lines from..to-1. */
function bytesOfLines(from: number, to: number): number {
  let n = 0;
  for (let k = from; k < to; k++) n += lineBytes(k);
  return n;
}

interface Stream {
  sock: net.Socket;
  timer?: NodeJS.Timeout;
  /** Next sequence number to write. */
  sent: number;
  /** Next sequence number expected back. */
  expected: number;
  partial: string;
  lostBytes: number;
  dupBytes: number;
  corruptBytes: number;
  /** Epoch ms of every echo since the group was armed (before the cut), so the first one after the restore is exact. */
  rxTimes: number[];
  /** movedAt()'s answer once found (the restore time does not change after it is marked). */
  moved?: number;
  /** Epoch ms and how the connection ended, when it ended before finish(). */
  closedAt?: number;
  closedHow?: string;
}

interface StreamGroup {
  streams: Stream[];
  /** Set just before the cut: echoes are timed from then on. */
  armed: boolean;
  cutAt?: number;
  restoreAt?: number;
  finishing: boolean;
}

export interface StreamsStatus {
  open: number;
  closed: number;
  /** Open connections that received an echo since they opened. */
  echoed: number;
  /** Open connections whose first echo after the restore mark arrived. */
  moved: number;
}

export interface StreamsResult {
  opened: number;
  /** Closed (error or end) before finish(). */
  lost: number;
  /** Open at finish() but no echo after the restore. */
  stalled: number;
  /** Open and moved data after the restore. */
  survived: number;
  /** Over the survivors: echo lines missing (gaps, and lines never echoed within the drain), duplicated, unreadable. */
  lostBytes: number;
  dupBytes: number;
  corruptBytes: number;
  /** Survivors: ms from the restore to their first echo. */
  movedAfterRestoreMs: number[];
  /** Lost connections: ms from the cut to their end (negative: before the cut). */
  closedAfterCutMs: number[];
  /** Lost connections by how they ended ("error ECONNRESET", "end"). */
  closedHow: Record<string, number>;
}

export type ReconnectCommands = {
  /** A relay to `targets` (127.0.0.1 ports, round robin); returns its id and port. */
  relay: { args: { targets: number[] }; result: { id: number; port: number } };
  /** Resets every pair and refuses (RST) until restore; `at`: epoch ms of the cut. */
  cut: { args: { id: number }; result: { at: number; reset: number } };
  restore: { args: { id: number }; result: { at: number } };
  relayStats: { args: { id: number }; result: RelayStats };
  closeRelay: { args: { id: number }; result: null };
  /** Opens `count` counter streams, `concurrency` at a time, CONNECT `authority` over `uds`. */
  openStreams: {
    args: { group: string; uds: string; authority: string; count: number; concurrency: number; intervalMs: number };
    result: { opened: number; failed: number; firstError?: string };
  };
  /** Before the cut (arm: time echoes from now on), then the epoch ms of the cut and of the restore as the relay reported them. */
  markStreams: { args: { group: string; arm?: boolean; cutAt?: number; restoreAt?: number }; result: null };
  streamsStatus: { args: { group: string }; result: StreamsStatus };
  /** Stops writing, waits up to drainMs for every open connection's echo to catch up, counts, closes all. */
  finishStreams: { args: { group: string; drainMs: number }; result: StreamsResult };
};

const relays = new Map<number, Relay>();
let relaySeq = 0;
const groups = new Map<string, StreamGroup>();

function relayOf(id: number): Relay {
  const r = relays.get(id);
  if (!r) throw new Error(`no relay ${id}`);
  return r;
}

function groupOf(name: string): StreamGroup {
  const g = groups.get(name);
  if (!g) throw new Error(`no stream group ${name}`);
  return g;
}

/** Checks echoed lines against what was written, in order. */
function onEcho(g: StreamGroup, s: Stream, chunk: Buffer): void {
  if (g.armed && !g.finishing && s.rxTimes.length < MAX_RX_TIMES) s.rxTimes.push(epochMs());
  const text = s.partial + chunk.toString('latin1');
  const lines = text.split('\n');
  s.partial = lines.pop() ?? '';
  for (const line of lines) {
    const seq = /^\d+$/.test(line) ? Number(line) : Number.NaN;
    if (!Number.isSafeInteger(seq) || seq >= s.sent) {
      s.corruptBytes += line.length + 1;
    } else if (seq === s.expected) {
      s.expected++;
    } else if (seq < s.expected) {
      s.dupBytes += line.length + 1;
    } else {
      s.lostBytes += bytesOfLines(s.expected, seq);
      s.expected = seq + 1;
    }
  }
}

/** Echo times kept per stream: 10 a second for over a minute. */
const MAX_RX_TIMES = 1000;

/** Epoch ms of the first echo at or after the restore, if any. */
function movedAt(g: StreamGroup, s: Stream): number | undefined {
  const restore = g.restoreAt;
  if (restore === undefined) return undefined;
  s.moved ??= s.rxTimes.find((t) => t >= restore);
  return s.moved;
}

/** Socket buffers past this are not added to: a stream stalled for long stays bounded. */
const MAX_UNSENT_BYTES = 64 * 1024;

function startStream(g: StreamGroup, sock: net.Socket, intervalMs: number): Stream {
  const s: Stream = { sock, rxTimes: [], sent: 0, expected: 0, partial: '', lostBytes: 0, dupBytes: 0, corruptBytes: 0 };
  sock.setNoDelay(true);
  sock.on('data', (c: Buffer) => onEcho(g, s, c));
  let how = 'close';
  sock.on('error', (err: NodeJS.ErrnoException) => (how = `error ${err.code ?? err.message}`));
  sock.once('end', () => (how = 'end'));
  sock.once('close', () => {
    clearInterval(s.timer);
    if (!g.finishing && s.closedAt === undefined) {
      s.closedAt = epochMs();
      s.closedHow = how;
    }
  });
  sock.resume(); // httpConnect leaves it paused, early bytes unshifted
  const write = (): void => {
    if (sock.destroyed || sock.writableLength > MAX_UNSENT_BYTES) return;
    sock.write(`${s.sent++}\n`);
  };
  // Spread over the interval, so the lines of a thousand connections do not leave in one burst.
  const start = setTimeout(() => {
    write();
    s.timer = setInterval(write, intervalMs);
  }, Math.random() * intervalMs);
  sock.once('close', () => clearTimeout(start));
  return s;
}

async function openStreams(a: ReconnectCommands['openStreams']['args']): Promise<ReconnectCommands['openStreams']['result']> {
  if (groups.has(a.group)) throw new Error(`stream group ${a.group} exists`);
  const g: StreamGroup = { streams: [], armed: false, finishing: false };
  groups.set(a.group, g);
  let failed = 0;
  let firstError: string | undefined;
  let next = 0;
  const lane = async (): Promise<void> => {
    while (next < a.count) {
      next++;
      try {
        const sock = await httpConnect(await connectUnix(a.uds), a.authority, 15_000);
        g.streams.push(startStream(g, sock, a.intervalMs));
      } catch (err) {
        failed++;
        firstError ??= errorMessage(err);
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(a.concurrency, a.count) }, lane));
  return { opened: g.streams.length, failed, firstError };
}

function status(g: StreamGroup): StreamsStatus {
  let open = 0;
  let echoed = 0;
  let moved = 0;
  for (const s of g.streams) {
    if (s.closedAt !== undefined) continue;
    open++;
    if (s.expected > 0) echoed++;
    if (movedAt(g, s) !== undefined) moved++;
  }
  return { open, closed: g.streams.length - open, echoed, moved };
}

async function finishStreams(a: { group: string; drainMs: number }): Promise<StreamsResult> {
  const g = groupOf(a.group);
  const open = (): Stream[] => g.streams.filter((s) => s.closedAt === undefined);
  for (const s of g.streams) clearInterval(s.timer);
  // What was written before the timers stopped still has to come back; bounded by drainMs.
  const deadline = Date.now() + a.drainMs;
  while (Date.now() < deadline && open().some((s) => movedAt(g, s) !== undefined && s.expected < s.sent)) {
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  g.finishing = true;
  const r: StreamsResult = {
    opened: g.streams.length,
    lost: 0,
    stalled: 0,
    survived: 0,
    lostBytes: 0,
    dupBytes: 0,
    corruptBytes: 0,
    movedAfterRestoreMs: [],
    closedAfterCutMs: [],
    closedHow: {},
  };
  for (const s of g.streams) {
    const moved = movedAt(g, s);
    if (s.closedAt !== undefined) {
      r.lost++;
      if (g.cutAt !== undefined) r.closedAfterCutMs.push(s.closedAt - g.cutAt);
      const how = s.closedHow ?? 'close';
      r.closedHow[how] = (r.closedHow[how] ?? 0) + 1;
    } else if (moved === undefined || g.restoreAt === undefined) {
      r.stalled++;
    } else {
      r.survived++;
      r.movedAfterRestoreMs.push(moved - g.restoreAt);
      r.lostBytes += s.lostBytes + bytesOfLines(s.expected, s.sent);
      r.dupBytes += s.dupBytes;
      r.corruptBytes += s.corruptBytes;
    }
    s.sock.destroy();
  }
  groups.delete(a.group);
  return r;
}

serveCommands<ReconnectCommands>({
  async relay({ targets }) {
    const id = ++relaySeq;
    const r = new Relay(targets);
    relays.set(id, r);
    return { id, port: await r.listen() };
  },
  cut({ id }) {
    const r = relayOf(id);
    const at = epochMs();
    return { at, reset: r.cut() };
  },
  restore({ id }) {
    relayOf(id).restore();
    return { at: epochMs() };
  },
  relayStats({ id }) {
    return relayOf(id).counts();
  },
  async closeRelay({ id }) {
    await relayOf(id).close();
    relays.delete(id);
    return null;
  },
  openStreams,
  markStreams({ group, arm, cutAt, restoreAt }) {
    const g = groupOf(group);
    if (arm) g.armed = true;
    if (cutAt !== undefined) g.cutAt = cutAt;
    if (restoreAt !== undefined) g.restoreAt = restoreAt;
    return null;
  },
  streamsStatus({ group }) {
    return status(groupOf(group));
  },
  finishStreams,
});
