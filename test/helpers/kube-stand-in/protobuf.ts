/**
 * The kube-apiserver's protobuf encoding (application/vnd.kubernetes.protobuf)
 * for the objects the stand-in serves, so clients that default to it (client-go:
 * upstream's --kube-api-content-type) are answered as a real API server answers
 * them (k8s.io/apimachinery/pkg/runtime/serializer/protobuf):
 * - an object is the magic "k8s\0" then a runtime.Unknown {typeMeta, raw};
 * - a watch stream is length-delimited frames (4-byte big-endian length) of
 *   metav1.WatchEvent without that envelope, whose object.raw is an enveloped object.
 * The messages below are the subset of the upstream generated.proto files
 * (k8s.io/api coordination/v1, authentication/v1; apimachinery meta/v1,
 * runtime) with their field numbers. Objects cross this module in their JSON
 * shape, so the rest of the stand-in is encoding-agnostic.
 */
import protobuf from 'protobufjs';
import { errorMessage } from '../../../src/common/error-message.js';

export const PROTOBUF = 'application/vnd.kubernetes.protobuf';
const MAGIC = Buffer.from('k8s\0', 'latin1');

const PROTO = `
syntax = "proto2";
package k8s;
message TypeMeta { optional string apiVersion = 1; optional string kind = 2; }
message Unknown { optional TypeMeta typeMeta = 1; optional bytes raw = 2; optional string contentEncoding = 3; optional string contentType = 4; }
message Time { optional int64 seconds = 1; optional int32 nanos = 2; }
message ObjectMeta {
  optional string name = 1; optional string generateName = 2; optional string namespace = 3; optional string selfLink = 4;
  optional string uid = 5; optional string resourceVersion = 6; optional int64 generation = 7; optional Time creationTimestamp = 8;
  map<string, string> labels = 11; map<string, string> annotations = 12;
}
message ListMeta { optional string selfLink = 1; optional string resourceVersion = 2; optional string continue = 3; optional int64 remainingItemCount = 4; }
message StatusDetails { optional string name = 1; optional string group = 2; optional string kind = 3; optional int32 retryAfterSeconds = 5; optional string uid = 6; }
message Status { optional ListMeta metadata = 1; optional string status = 2; optional string message = 3; optional string reason = 4; optional StatusDetails details = 5; optional int32 code = 6; }
message RawExtension { optional bytes raw = 1; }
message WatchEvent { optional string type = 1; optional RawExtension object = 2; }
message Preconditions { optional string uid = 1; optional string resourceVersion = 2; }
message DeleteOptions { optional int64 gracePeriodSeconds = 1; optional Preconditions preconditions = 2; optional bool orphanDependents = 3; optional string propagationPolicy = 4; repeated string dryRun = 5; }
message LeaseSpec {
  optional string holderIdentity = 1; optional int32 leaseDurationSeconds = 2; optional Time acquireTime = 3; optional Time renewTime = 4;
  optional int32 leaseTransitions = 5; optional string strategy = 6; optional string preferredHolder = 7;
}
message Lease { optional ObjectMeta metadata = 1; optional LeaseSpec spec = 2; }
message LeaseList { optional ListMeta metadata = 1; repeated Lease items = 2; }
message TokenReviewSpec { optional string token = 1; repeated string audiences = 2; }
message ExtraValue { repeated string items = 1; }
message UserInfo { optional string username = 1; optional string uid = 2; repeated string groups = 3; map<string, ExtraValue> extra = 4; }
message TokenReviewStatus { optional bool authenticated = 1; optional UserInfo user = 2; optional string error = 3; repeated string audiences = 4; }
message TokenReview { optional ObjectMeta metadata = 1; optional TokenReviewSpec spec = 2; optional TokenReviewStatus status = 3; }
`;

const root = protobuf.parse(PROTO, { keepCase: true }).root;
const type = (name: string): protobuf.Type => root.lookupType(`k8s.${name}`);
const TO_OBJECT: protobuf.IConversionOptions = { longs: Number, bytes: Buffer, defaults: false, arrays: false, objects: false };

type Json = Record<string, unknown>;

/**
 * Which message a kind is, and where its JSON shape differs from the message:
 * times (RFC 3339 strings ↔ Time), extra values (string arrays ↔ ExtraValue).
 */
const KINDS: Record<string, { message: string; times: Array<{ path: string[]; micro: boolean }>; extra?: string[] }> = {
  Lease: {
    message: 'Lease',
    times: [
      { path: ['metadata', 'creationTimestamp'], micro: false },
      { path: ['spec', 'renewTime'], micro: true },
      { path: ['spec', 'acquireTime'], micro: true },
    ],
  },
  TokenReview: { message: 'TokenReview', times: [], extra: ['status', 'user', 'extra'] },
  Status: { message: 'Status', times: [] },
  DeleteOptions: { message: 'DeleteOptions', times: [] },
};

export class ProtobufError extends Error {}

/** An enveloped object from a request body, in its JSON shape (apiVersion and kind from the envelope). */
export function decodeObject(body: Buffer): Json {
  try {
    return decodeEnvelope(body);
  } catch (err) {
    if (err instanceof ProtobufError) throw err;
    throw new ProtobufError(`malformed protobuf body: ${errorMessage(err)}`);
  }
}

function decodeEnvelope(body: Buffer): Json {
  if (!body.subarray(0, 4).equals(MAGIC)) throw new ProtobufError('protobuf body without the "k8s\\0" prefix');
  const unknown = type('Unknown').toObject(type('Unknown').decode(body.subarray(4)), TO_OBJECT) as {
    typeMeta?: { apiVersion?: string; kind?: string };
    raw?: Buffer;
  };
  const kind = unknown.typeMeta?.kind ?? '';
  const listOf = kind.endsWith('List') ? KINDS[kind.slice(0, -4)] : undefined;
  const spec = listOf ?? KINDS[kind];
  if (!spec) throw new ProtobufError(`the stand-in cannot decode protobuf kind ${JSON.stringify(kind)}`);
  const message = type(listOf ? kind : spec.message);
  const object = message.toObject(message.decode(unknown.raw ?? Buffer.alloc(0)), TO_OBJECT);
  for (const item of listOf ? ((object.items ?? []) as Json[]) : [object]) toJsonShape(item, spec);
  return { apiVersion: unknown.typeMeta?.apiVersion, kind, ...object };
}

function toJsonShape(object: Json, spec: (typeof KINDS)[string]): void {
  for (const t of spec.times) mapAt(object, t.path, (v) => timeToJson(v as { seconds?: number; nanos?: number }, t.micro));
  if (spec.extra)
    mapAt(object, spec.extra, (v) =>
      Object.fromEntries(Object.entries(v as Record<string, { items?: string[] }>).map(([k, e]) => [k, e.items ?? []])),
    );
}

/** An object (JSON shape, with apiVersion and kind) enveloped; a list is encoded as its kind + "List". */
export function encodeObject(object: Json): Buffer {
  const kind = String(object.kind);
  const listOf = kind.endsWith('List') ? KINDS[kind.slice(0, -4)] : undefined;
  const spec = KINDS[kind];
  let raw: Uint8Array;
  if (listOf) {
    const items = ((object.items ?? []) as Json[]).map((item) => withProtoTimes(item, listOf.times));
    raw = encode(kind, { metadata: object.metadata, items });
  } else if (spec) {
    const proto = withProtoTimes(object, spec.times);
    if (spec.extra)
      mapAt(proto, spec.extra, (v) =>
        Object.fromEntries(Object.entries(v as Record<string, string[]>).map(([k, items]) => [k, { items }])),
      );
    raw = encode(spec.message, proto);
  } else {
    throw new ProtobufError(`the stand-in cannot encode kind ${kind}`);
  }
  const unknown = encode('Unknown', { typeMeta: { apiVersion: object.apiVersion, kind }, raw: Buffer.from(raw) });
  return Buffer.concat([MAGIC, unknown]);
}

/** One frame of a protobuf watch stream. */
export function encodeWatchFrame(eventType: string, object: Json): Buffer {
  const event = encode('WatchEvent', { type: eventType, object: { raw: encodeObject(object) } });
  const length = Buffer.alloc(4);
  length.writeUInt32BE(event.length);
  return Buffer.concat([length, event]);
}

function encode(message: string, object: unknown): Uint8Array {
  const t = type(message);
  const err = t.verify(t.fromObject(object as Json));
  if (err) throw new ProtobufError(`${message}: ${err}`);
  return t.encode(t.fromObject(object as Json)).finish();
}

function withProtoTimes(object: Json, times: Array<{ path: string[] }>): Json {
  const copy = structuredClone(object);
  for (const t of times) mapAt(copy, t.path, (v) => timeToProto(String(v)));
  return copy;
}

function mapAt(object: Json, path: string[], fn: (value: unknown) => unknown): void {
  let node: Json | undefined = object;
  for (const key of path.slice(0, -1)) node = node?.[key] as Json | undefined;
  const last = path.at(-1)!;
  if (node && node[last] !== undefined && node[last] !== null) node[last] = fn(node[last]);
}

function timeToProto(text: string): { seconds: number; nanos: number } {
  const ms = Date.parse(text);
  const fraction = /\.(\d+)/.exec(text)?.[1] ?? '';
  return { seconds: Math.floor(ms / 1000), nanos: Number(fraction.padEnd(9, '0').slice(0, 9)) };
}

/** metav1.Time is RFC 3339 in seconds, MicroTime with six fractional digits. */
function timeToJson(t: { seconds?: number; nanos?: number }, micro: boolean): string {
  const base = new Date((t.seconds ?? 0) * 1000).toISOString().slice(0, 19);
  return micro ? `${base}.${String(Math.floor((t.nanos ?? 0) / 1000)).padStart(6, '0')}Z` : `${base}Z`;
}

/** Splits a protobuf watch stream into its events (for tests of the stand-in); a partial last frame is left out. */
export function decodeWatchFrames(stream: Buffer): Array<{ type: string; object: Json }> {
  const events: Array<{ type: string; object: Json }> = [];
  const t = type('WatchEvent');
  for (let at = 0; at + 4 <= stream.length;) {
    const length = stream.readUInt32BE(at);
    if (at + 4 + length > stream.length) break;
    const event = t.toObject(t.decode(stream.subarray(at + 4, at + 4 + length)), TO_OBJECT) as { type: string; object?: { raw?: Buffer } };
    events.push({ type: event.type, object: decodeObject(event.object?.raw ?? Buffer.alloc(0)) });
    at += 4 + length;
  }
  return events;
}
