/** gRPC metadata between grpc-js's `Metadata` and Kanal's `MetadataMap`, `-bin` values as base64 text. */
import * as grpc from '@grpc/grpc-js';
import type { MetadataMap } from '../../wire/metadata.js';

export function fromGrpcMetadata(md: grpc.Metadata): MetadataMap {
  const out = new Map<string, string[]>();
  for (const [key, values] of Object.entries(md.toJSON())) {
    out.set(
      key.toLowerCase(),
      values.map((v) => (typeof v === 'string' ? v : v.toString('base64'))),
    );
  }
  return out;
}

export function toGrpcMetadata(entries: Record<string, string>): grpc.Metadata {
  const md = new grpc.Metadata();
  // gRPC carries "-bin" values as bytes; ours are base64 text, as they arrive.
  for (const [key, value] of Object.entries(entries)) md.set(key, key.endsWith('-bin') ? Buffer.from(value, 'base64') : value);
  return md;
}
