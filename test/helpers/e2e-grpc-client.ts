/**
 * A gRPC frontend client written directly on @grpc/grpc-js, speaking the
 * ProxyService/Proxy stream the way upstream's konnectivity-client does
 * (no Kanal extensions): DIAL_REQ -> DIAL_RSP -> DATA both ways ->
 * CLOSE_REQ -> CLOSE_RSP. Packets are (de)serialized with src/wire/codec.ts.
 * Independent of Kanal's own transport and tunnel code on purpose.
 */
import { createHash, randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import * as grpc from '@grpc/grpc-js';
import { decodePacket, encodePacket } from '../../src/wire/codec.js';
import { PacketType, type Packet } from '../../src/wire/packet.js';
import { Wakeup } from './wakeup.js';

/** A packet, or raw bytes sent as one gRPC message (for malformed-input tests). */
export type Outgoing = Packet | Buffer;
type Call = grpc.ClientDuplexStream<Outgoing, Packet>;

export type PacketOf<T extends PacketType> = Extract<Packet, { type: T }>;

export class ProxyStream {
  readonly client: grpc.Client;
  readonly call: Call;
  /** Resolves with the call's final status (never rejects). */
  readonly status: Promise<grpc.StatusObject>;
  private readonly queue: Packet[] = [];
  private readonly arrivals = new Wakeup();
  private ended = false;

  constructor(
    target: string,
    opts: {
      credentials?: grpc.ChannelCredentials;
      metadata?: Record<string, string>;
      channelOptions?: grpc.ChannelOptions;
      /** Method path; default the frontend's /ProxyService/Proxy. */
      path?: string;
    } = {},
  ) {
    this.client = new grpc.Client(target, opts.credentials ?? grpc.credentials.createInsecure(), {
      // Each stream on its own connection, like separate KAS connections.
      'grpc.use_local_subchannel_pool': 1,
      ...opts.channelOptions,
    });
    const md = new grpc.Metadata();
    for (const [k, v] of Object.entries(opts.metadata ?? {})) md.set(k, v);
    this.call = this.client.makeBidiStreamRequest<Outgoing, Packet>(
      opts.path ?? '/ProxyService/Proxy',
      (p: Outgoing) => (Buffer.isBuffer(p) ? p : encodePacket(p)),
      (b: Buffer) => decodePacket(b),
      md,
    );
    this.call.on('data', (p: Packet) => {
      this.queue.push(p);
      this.arrivals.wakeAll();
    });
    this.call.on('error', () => undefined); // the status carries it
    this.status = new Promise<grpc.StatusObject>((resolve) =>
      this.call.on('status', (s: grpc.StatusObject) => {
        this.ended = true;
        this.arrivals.wakeAll();
        resolve(s);
      }),
    );
  }

  /** Writes a packet (or raw message bytes); resolves once grpc-js has taken it. */
  send(p: Outgoing): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      this.call.write(p, (err: Error | null | undefined) => (err ? reject(err) : resolve()));
    });
  }

  /**
   * Takes the first queued packet that matches (others stay queued), waiting
   * up to timeoutMs. Throws if the call ends or the time is up.
   */
  async take<T extends PacketType>(type: T, match: (p: PacketOf<T>) => boolean, timeoutMs: number): Promise<PacketOf<T>> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const i = this.queue.findIndex((p) => p.type === type && match(p as PacketOf<T>));
      if (i >= 0) return this.queue.splice(i, 1)[0] as PacketOf<T>;
      if (this.ended) throw new Error(`stream ended while waiting for ${PacketType[type]}`);
      const left = deadline - Date.now();
      if (left <= 0)
        throw new Error(
          `no ${PacketType[type]} within ${timeoutMs} ms (queued: ${this.queue.map((p) => PacketType[p.type]).join(',') || 'none'})`,
        );
      await this.arrivals.wait(left);
    }
  }

  /** Packets received and not taken yet. */
  pending(): readonly Packet[] {
    return this.queue;
  }

  /** DIAL_REQ -> DIAL_RSP. Resolves with the connectID, or the error string of the DIAL_RSP. */
  async dial(address: string, timeoutMs = 15_000): Promise<{ connectID: number; error: string }> {
    const random = randomBytes(8).readBigInt64BE();
    await this.send({ type: PacketType.DIAL_REQ, protocol: 'tcp', address, random });
    const rsp = await this.take(PacketType.DIAL_RSP, (p) => p.random === random, timeoutMs);
    return { connectID: rsp.connectID, error: rsp.error };
  }

  /** The CLOSE_REQ/CLOSE_RSP the server sent for connectID, if one is queued. */
  closedByServer(connectID: number): Packet | undefined {
    return this.queue.find((p) => (p.type === PacketType.CLOSE_RSP || p.type === PacketType.CLOSE_REQ) && p.connectID === connectID);
  }

  /** Sends `data` as DATA packets of at most `chunk` bytes; stops (throws) if the server closed the connection. */
  async write(connectID: number, data: Buffer, chunk = 32 * 1024): Promise<void> {
    for (let off = 0; off < data.length; off += chunk) {
      const closed = this.closedByServer(connectID);
      if (closed) throw new Error(`server closed connection ${connectID} (${PacketType[closed.type]}) after ${off} bytes written`);
      await this.send({ type: PacketType.DATA, connectID, error: '', data: data.subarray(off, off + chunk) });
    }
  }

  /** Collects DATA payloads for connectID until `n` bytes arrived; throws if the server closes it first. */
  async read(connectID: number, n: number, timeoutMs: number): Promise<Buffer> {
    const deadline = Date.now() + timeoutMs;
    const parts: Buffer[] = [];
    let got = 0;
    while (got < n) {
      const hasData = this.queue.some((p) => p.type === PacketType.DATA && p.connectID === connectID);
      const closed = this.closedByServer(connectID);
      if (!hasData && closed)
        throw new Error(
          `server closed connection ${connectID} (${PacketType[closed.type]} ${JSON.stringify('error' in closed ? closed.error : '')}) after ${got}/${n} bytes read`,
        );
      const p = await this.take(PacketType.DATA, (d) => d.connectID === connectID, Math.max(1, Math.min(250, deadline - Date.now()))).catch(
        (err: Error) => {
          if (Date.now() >= deadline || this.ended) throw err;
          return undefined;
        },
      );
      if (!p) continue;
      if (p.error) throw new Error(`DATA error for ${connectID}: ${p.error}`);
      parts.push(Buffer.from(p.data));
      got += p.data.length;
    }
    return Buffer.concat(parts);
  }

  /** Writes `data` on connectID (dialled to an echo backend) and reads as many bytes back: whether they are the same. */
  async echoes(connectID: number, data: Buffer, timeoutMs: number): Promise<boolean> {
    const reading = this.read(connectID, data.length, timeoutMs);
    await this.write(connectID, data);
    return (await reading).equals(data);
  }

  /**
   * Reads `n` bytes of connectID's DATA and resolves with their sha256. With
   * `bytesPerSecond` the call is paused whenever it is ahead of that pace, so
   * HTTP/2 flow control holds the server back (a slow konnectivity-client user).
   */
  async readHashed(connectID: number, n: number, timeoutMs: number, bytesPerSecond?: number): Promise<string> {
    const deadline = Date.now() + timeoutMs;
    const hash = createHash('sha256');
    const t0 = performance.now();
    let got = 0;
    while (got < n) {
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`read ${got}/${n} bytes of connection ${connectID} in ${timeoutMs} ms`);
      const closed = this.closedByServer(connectID);
      if (closed && !this.queue.some((p) => p.type === PacketType.DATA && p.connectID === connectID)) {
        throw new Error(`server closed connection ${connectID} (${PacketType[closed.type]}) after ${got}/${n} bytes read`);
      }
      const p = await this.take(PacketType.DATA, (d) => d.connectID === connectID, Math.min(250, left)).catch((err: Error) => {
        if (this.ended) throw err;
        return undefined;
      });
      if (!p) continue;
      const take = p.data.subarray(0, n - got);
      hash.update(take);
      got += take.length;
      const ahead = bytesPerSecond ? (got / bytesPerSecond) * 1000 - (performance.now() - t0) : 0;
      if (ahead > 1) {
        this.call.pause();
        await sleep(ahead);
        this.call.resume();
      }
    }
    return hash.digest('hex');
  }

  /** CLOSE_REQ -> CLOSE_RSP for connectID; resolves with the CLOSE_RSP. */
  async closeConnection(connectID: number, timeoutMs = 10_000): Promise<PacketOf<PacketType.CLOSE_RSP>> {
    await this.send({ type: PacketType.CLOSE_REQ, connectID });
    return this.take(PacketType.CLOSE_RSP, (p) => p.connectID === connectID, timeoutMs);
  }

  /** Half-closes the call and closes the channel. */
  close(): void {
    this.call.end();
    this.client.close();
  }

  /** Cancels the call and closes the channel. */
  cancel(): void {
    this.call.cancel();
    this.client.close();
  }
}
