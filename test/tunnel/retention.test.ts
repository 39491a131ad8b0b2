/**
 * What a sender keeps for a resend is its own decision (docs/limits.md,
 * "Retained bytes"): a peer that negotiates resume, grants credit and never
 * acknowledges makes this side keep at most its own largest window per
 * connection, and the ledger's caps over all of an agent's connections;
 * the local end is then not read (back-pressure) until acknowledgements
 * come. Credit, or a resume entry's limit, beyond the protocol's largest
 * window closes that connection only. The peer here is raw packets, as an
 * attacker writes them, against a server's tunnel and an agent's (a server
 * can be the hostile peer of an agent).
 */
import test, { type ExecutionContext } from 'ava';
import type { Duplex } from 'node:stream';
import { Feature, type FeatureSet } from '../../src/wire/features.js';
import { PacketType, type Packet } from '../../src/wire/packet.js';
import { MAX_WINDOW_BYTES } from '../../src/wire/window-maximum.js';
import { Tunnel } from '../../src/tunnel/tunnel.js';
import { DEFAULT_LIMITS } from '../../src/tunnel/limits.js';
import { RetentionLedger } from '../../src/domain/retention-ledger.js';
import type { RefusalReason } from '../../src/domain/refusal-reason.js';
import {
  captureLogger,
  createMemoryLink,
  duplexPair,
  nextPacket,
  tunnelPair,
  waitFor,
  type MemoryPacketStream,
} from '../helpers/memory-stream.js';
import { splice } from '../../src/tunnel/splice.js';

const RESUME: FeatureSet = new Set([Feature.Window, Feature.HalfClose, Feature.Resume]);
const MiB = 1024 * 1024;
const CAP = DEFAULT_LIMITS.maxWindowBytes;

/** A destination that writes as fast as it is read (chargen); counts what it wrote and whether it is held back now. */
class Chargen {
  written = 0;
  blocked = false;
  private stopped = false;
  constructor(private readonly end: Duplex) {
    end.on('error', () => undefined);
    end.on('drain', () => this.pump());
    end.resume(); // reads (and drops) what comes to it
    this.pump();
  }
  stop(): void {
    this.stopped = true;
  }
  private pump(): void {
    this.blocked = false;
    const chunk = Buffer.alloc(64 * 1024, 0x61);
    while (!this.stopped && !this.end.destroyed) {
      this.written += chunk.length;
      if (!this.end.write(chunk)) {
        this.blocked = true;
        return;
      }
    }
  }
}

interface Stand {
  server: Tunnel;
  /** The hostile agent's end: raw packets. */
  peer: MemoryPacketStream;
  chargens: Chargen[];
  faults: RefusalReason[];
  log: ReturnType<typeof captureLogger>;
  /** DATA bytes received per connection. */
  received: Map<number, number>;
  /** Asks the server to dial (node -> control plane); resolves with the connection's ID. */
  dial(): Promise<number>;
}

function stand(t: ExecutionContext, opts: { ledger?: RetentionLedger; agentCap?: number; side?: 'server' | 'agent' } = {}): Stand {
  const link = createMemoryLink();
  const chargens: Chargen[] = [];
  const faults: RefusalReason[] = [];
  const log = captureLogger('debug');
  const received = new Map<number, number>();
  const agentAccount = opts.ledger?.tenant('t', Number.POSITIVE_INFINITY).child('agent', 'a', opts.agentCap ?? Number.POSITIVE_INFINITY);
  const server = new Tunnel(link.b, {
    side: opts.side ?? 'server',
    features: RESUME,
    log: log.log,
    resumeTimeoutMs: 5000,
    dialHandler: () => {
      const [mine, theirs] = duplexPair();
      chargens.push(new Chargen(theirs));
      return Promise.resolve(mine);
    },
    onPeerFault: (reason) => faults.push(reason),
    ...(agentAccount ? { accounts: agentAccount } : {}),
  });
  link.a.on('packet', (p: Packet) => {
    if (p.type === PacketType.DATA) received.set(p.connectID, (received.get(p.connectID) ?? 0) + p.data.length);
  });
  t.teardown(() => {
    for (const c of chargens) c.stop();
    server.close();
  });
  let dials = 0n;
  return {
    server,
    peer: link.a,
    chargens,
    faults,
    log,
    received,
    async dial() {
      const random = ++dials;
      const answer = nextPacket(link.a, PacketType.DIAL_RSP, (p) => p.random === random);
      link.a.send({ type: PacketType.DIAL_REQ, protocol: 'tcp', address: 'chargen:19', random });
      const rsp = await answer;
      t.is(rsp.error, '');
      return rsp.connectID;
    },
  };
}

/**
 * Grants credit for every byte that arrives (those that came before too), as
 * a reader that keeps up would; acknowledges them too when `acks`, else never.
 */
function credit(s: Stand, connectID: number, acks = false): void {
  const grant = (increment: number): void => {
    const received = s.received.get(connectID) ?? 0;
    s.peer.send({ type: PacketType.KANAL_WINDOW, connectID, increment, ...(acks ? { acknowledged: received } : {}) });
  };
  const before = s.received.get(connectID) ?? 0;
  if (before > 0) grant(before);
  s.peer.on('packet', (p: Packet) => {
    if (p.type === PacketType.DATA && p.connectID === connectID && p.data.length > 0) grant(p.data.length);
  });
}

function creditWithoutAcks(s: Stand, connectID: number): void {
  credit(s, connectID, false);
}

for (const side of ['server', 'agent'] as const) {
  test(`${side}: a peer that grants the largest window and never acknowledges: at most our largest window is kept, then the destination is not read`, async (t) => {
    const s = stand(t, { side });
    const id = await s.dial();
    // One window of the protocol's maximum, topped up as bytes come: credit is never what stops the sender.
    s.peer.send({ type: PacketType.KANAL_WINDOW, connectID: id, increment: MAX_WINDOW_BYTES - DEFAULT_LIMITS.windowBytes });
    creditWithoutAcks(s, id);
    await waitFor(
      () => s.server.retainedBytes() === CAP && s.chargens[0].blocked && s.received.get(id) === CAP,
      'the server keeps its cap and stops reading',
    );
    const chargen = s.chargens[0];
    t.is(s.server.retainedBytes(), CAP, 'exactly its own largest window is kept');
    t.is(s.received.get(id), CAP, 'nothing beyond what it keeps was sent');
    // What the destination wrote beyond the kept bytes sits in socket buffers and one read: bounded, not the peer's credit.
    t.true(chargen.written - CAP <= MiB, `the destination was held back (${chargen.written} B written)`);
    t.is(s.server.connection(id)?.state, 'open', 'back-pressure, not a close');
    t.deepEqual(s.faults, []);
    // The acknowledgement frees it: bytes move again, and what is kept stays within the cap.
    s.peer.send({ type: PacketType.KANAL_WINDOW, connectID: id, increment: 0, acknowledged: CAP });
    await waitFor(() => (s.received.get(id) ?? 0) >= 2 * CAP, 'bytes move again after the acknowledgement');
    t.true(s.server.retainedBytes() <= CAP);
  });
}

for (const side of ['server', 'agent'] as const) {
  test(`${side}: credit beyond the protocol maximum closes that connection only, with a reason naming it; the other moves on`, async (t) => {
    const s = stand(t, { side });
    const hostile = await s.dial();
    const honest = await s.dial();
    const closed = nextPacket(s.peer, PacketType.CLOSE_RSP, (p) => p.connectID === hostile);
    s.peer.send({ type: PacketType.KANAL_WINDOW, connectID: hostile, increment: 2 ** 50 });
    const rsp = await closed;
    t.regex(rsp.error, /beyond the protocol's largest window/);
    t.deepEqual(s.faults, ['window_beyond_maximum']);
    t.is(s.server.connection(hostile), undefined);
    t.true(
      s.log.lines.some((l) => l.msg.includes('closing connection') && l.msg.includes('largest window')),
      'logged',
    );
    // The honest one acknowledges what it gets and keeps receiving.
    credit(s, honest, true);
    await waitFor(() => (s.received.get(honest) ?? 0) >= 3 * CAP, 'the honest connection moves bytes');
    t.is(s.server.connection(honest)?.state, 'open');
  });
}

test('a resume entry whose limit lies beyond the protocol maximum closes that connection only', async (t) => {
  const s = stand(t);
  const hostile = await s.dial();
  const honest = await s.dial();
  await waitFor(() => (s.received.get(hostile) ?? 0) > 0 && (s.received.get(honest) ?? 0) > 0, 'both send');
  s.peer.destroy(new Error('connection reset'));
  await waitFor(() => s.server.detached, 'detached');
  const link = createMemoryLink();
  const got = new Map<number, number>();
  link.a.on('packet', (p: Packet) => {
    if (p.type === PacketType.DATA) got.set(p.connectID, (got.get(p.connectID) ?? 0) + p.data.length);
  });
  const closed = nextPacket(link.a, PacketType.CLOSE_RSP, (p) => p.connectID === hostile);
  t.true(s.server.reattach(link.b));
  const at = (id: number): number => s.received.get(id) ?? 0;
  link.a.send({
    type: PacketType.KANAL_RESUME,
    connectID: hostile,
    received: at(hostile),
    limit: at(hostile) + 2 ** 50,
    finReceived: false,
    dialID: 1n,
  });
  link.a.send({
    type: PacketType.KANAL_RESUME,
    connectID: honest,
    received: at(honest),
    limit: at(honest) + MiB,
    finReceived: false,
    dialID: 2n,
  });
  link.a.send({ type: PacketType.KANAL_RESUME_END });
  t.regex((await closed).error, /resume refused: .*resume limit lies beyond the protocol's largest window/);
  t.deepEqual(s.faults, ['window_beyond_maximum']);
  await waitFor(() => (got.get(honest) ?? 0) > 0, 'the honest connection sends on the new stream');
  t.is(s.server.connection(honest)?.state, 'open');
  t.is(s.server.connection(hostile), undefined);
  link.a.destroy();
});

test("an agent's cap holds over its connections: together they keep at most it; an acknowledgement on one lets the other go on", async (t) => {
  const ledger = new RetentionLedger({ budgetBytes: Number.POSITIVE_INFINITY });
  const agentCap = 6 * MiB;
  const s = stand(t, { ledger, agentCap });
  const a = await s.dial();
  const b = await s.dial();
  creditWithoutAcks(s, a);
  creditWithoutAcks(s, b);
  await waitFor(() => s.server.retainedBytes() === agentCap && s.chargens.every((c) => c.blocked), 'the agent cap is reached');
  const account = ledger.root.list()[0].list()[0];
  t.is(account.retained, agentCap, "the ledger's account says what the tunnel keeps");
  t.true(ledger.root.held >= agentCap);
  const before = { a: s.received.get(a) ?? 0, b: s.received.get(b) ?? 0 };
  t.true(before.a <= CAP && before.b <= CAP, 'neither passed its own cap');
  // Acknowledging all of one connection frees room under the agent's cap for both.
  s.peer.send({ type: PacketType.KANAL_WINDOW, connectID: a, increment: 0, acknowledged: before.a });
  await waitFor(() => (s.received.get(a) ?? 0) + (s.received.get(b) ?? 0) > before.a + before.b, 'bytes move again');
  await waitFor(() => account.retained === agentCap, 'filled to the cap again');
  t.true(s.server.retainedBytes() <= agentCap);
  // Closing the tunnel gives everything back.
  s.server.close();
  t.is(ledger.root.held, 0, 'nothing charged after the tunnel closed');
  t.is(ledger.root.list()[0].size, 0, 'the agent left its tenant');
});

test('shedding: over the budget, the connections of the agent that holds the most are closed with a reason naming the budget', async (t) => {
  const ledger = new RetentionLedger({ budgetBytes: Number.POSITIVE_INFINITY });
  const s = stand(t, { ledger });
  const id = await s.dial();
  creditWithoutAcks(s, id);
  await waitFor(() => s.server.retainedBytes() === CAP, 'the connection keeps its cap');
  const closed = nextPacket(s.peer, PacketType.CLOSE_RSP, (p) => p.connectID === id);
  ledger.configure(MiB);
  const rsp = await closed;
  t.regex(rsp.error, /memory budget \(1048576 bytes\) is spent and this agent held the most/);
  t.is(ledger.root.held, 0);
  t.is(s.server.retainedBytes(), 0);
  t.is(s.server.connection(id), undefined);
});

test('honest peers with the largest --max-connection-window never reach the protocol maximum: 96 MiB each way, no fault, windows grown', async (t) => {
  const faults: RefusalReason[] = [];
  const onPeerFault = (r: RefusalReason): void => void faults.push(r);
  const pods: Duplex[] = [];
  const pair = tunnelPair({
    features: RESUME,
    limits: { maxWindowBytes: MAX_WINDOW_BYTES },
    agentDialHandler: () => {
      const [mine, theirs] = duplexPair(256 * 1024);
      pods.push(theirs);
      return Promise.resolve(mine);
    },
    agentOptions: { onPeerFault, resumeTimeoutMs: 5000 },
    serverOptions: { onPeerFault, resumeTimeoutMs: 5000 },
    logLevel: 'warn',
  });
  t.teardown(() => pair.close());
  const conn = await pair.server.dial('pod:80', { timeoutMs: 5000 });
  const [mine, client] = duplexPair(256 * 1024);
  splice(mine, conn);
  await waitFor(() => pods.length === 1, 'the pod end');
  const size = 96 * MiB;
  let grown = 0;
  const watch = setInterval(
    () => (grown = Math.max(grown, pair.server.stats().windowGrowthBytes, pair.agent.stats().windowGrowthBytes)),
    5,
  );
  t.teardown(() => clearInterval(watch));
  const count = (s: Duplex): Promise<number> =>
    new Promise((resolve) => {
      let n = 0;
      s.on('data', (c: Buffer) => {
        n += c.length;
        if (n >= size) resolve(n);
      });
    });
  const gotDown = count(client);
  const gotUp = count(pods[0]);
  const chunk = Buffer.alloc(256 * 1024, 0x68);
  const writeAll = async (s: Duplex): Promise<void> => {
    for (let sent = 0; sent < size; sent += chunk.length) {
      if (!s.write(chunk)) await new Promise((resolve) => s.once('drain', resolve));
    }
  };
  await Promise.all([writeAll(client), writeAll(pods[0]), gotDown, gotUp]);
  t.deepEqual(faults, [], 'no window fault on either side');
  t.true(grown > 0, `windows grew beyond the first (${grown} B of growth held at most)`);
  t.log(`largest window growth held by a tunnel: ${grown} B`);
});
