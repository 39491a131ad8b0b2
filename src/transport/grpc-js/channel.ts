/** The grpc-js client side: a channel to a server and the bidirectional calls opened on it. */
import * as grpc from '@grpc/grpc-js';
import type { Packet } from '../../wire/packet.js';
import { DEFAULT_CLIENT_KEEPALIVE, POLICED_PING_INTERVAL_MS, type ChannelOptions, type GrpcChannel } from '../transport.js';
import { GrpcStatus, GrpcStatusError } from '../grpc-status.js';
import { decodeOrExplain, type Decoded } from '../decoded.js';
import { fromGrpcMetadata, toGrpcMetadata } from './metadata.js';
import { serializePacket } from './service-definition.js';
import { GrpcJsPacketCall } from './packet-call.js';
import { ClientTlsCredentials } from './tls-credentials.js';

export interface GrpcJsChannel extends GrpcChannel {
  /** The underlying grpc-js client (tests open calls with deadlines on it). */
  readonly client: grpc.Client;
}

export interface GrpcJsCallOptions {
  /** The method, e.g. AGENT_SERVICE_CONNECT. */
  path: string;
  metadata: Record<string, string>;
  /** Bounds the wait for the response headers. */
  timeoutMs: number;
  /** Sent as grpc-timeout; default none. */
  deadline?: grpc.Deadline;
  /** Names the far end in logs; default `path`. */
  peer?: string;
}

/** Opens a bidirectional call and resolves once the response headers arrived. */
export function openGrpcJsStream(
  client: grpc.Client,
  { path, metadata, timeoutMs, deadline = Infinity, peer = path }: GrpcJsCallOptions,
): Promise<GrpcJsPacketCall> {
  return new Promise<GrpcJsPacketCall>((resolve, reject) => {
    const call = client.makeBidiStreamRequest<Packet | Buffer, Decoded>(path, serializePacket, decodeOrExplain, toGrpcMetadata(metadata), {
      deadline,
    });
    let settled = false;
    const timer = setTimeout(() => {
      settle(new GrpcStatusError(GrpcStatus.DEADLINE_EXCEEDED, `no response headers within ${timeoutMs} ms`));
      call.cancel();
    }, timeoutMs);
    const onError = (err: Error & { code?: number; details?: string }): void =>
      settle(new GrpcStatusError(err.code ?? GrpcStatus.UNKNOWN, err.details ?? err.message));
    const settle = (result: Error | GrpcJsPacketCall): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      call.off('error', onError);
      if (result instanceof Error) {
        // The cancel below (or a late status) still emits 'error': unheard, it would crash the process.
        call.on('error', () => undefined);
        reject(result);
      } else {
        resolve(result);
      }
    };
    call.on('error', onError);
    call.once('metadata', (md: grpc.Metadata) => {
      // A Trailers-Only refusal may surface as metadata followed at once by
      // an error status; give that a turn to arrive before accepting.
      setImmediate(() => {
        if (!settled) settle(new GrpcJsPacketCall(call, 'client', fromGrpcMetadata(md), peer));
      });
    });
  });
}

export function createGrpcJsChannel(opts: ChannelOptions, extra: grpc.ChannelOptions = {}): GrpcJsChannel {
  const credentials = opts.tls ? new ClientTlsCredentials(opts.tls) : grpc.credentials.createInsecure();
  const keepalive = opts.keepalive ?? DEFAULT_CLIENT_KEEPALIVE;
  const options: grpc.ChannelOptions = {
    'grpc.max_receive_message_length': opts.maxReceiveMessageBytes ?? 4 * 1024 * 1024,
    // grpc-js cannot change a connection's PING interval once it learns who the server is: the policed spacing unless every server accepts more.
    'grpc.keepalive_time_ms': keepalive.acceptsFrequentPings
      ? Math.max(POLICED_PING_INTERVAL_MS, keepalive.intervalMs)
      : keepalive.intervalMs,
    'grpc.keepalive_timeout_ms': keepalive.timeoutMs,
    // One connection per channel: the agent needs one tunnel per server.
    'grpc.use_local_subchannel_pool': 1,
    // A tunnel stream is never retried; grpc-js's retry buffer would also
    // complete writes before they are sent, hiding a peer that does not read.
    'grpc.enable_retries': 0,
    ...extra,
  };
  const client = new grpc.Client(opts.target, credentials, options);
  return {
    client,
    openStream: (path, metadata, timeoutMs) => openGrpcJsStream(client, { path, metadata, timeoutMs, peer: opts.target }),
    close: () => client.close(),
  };
}
