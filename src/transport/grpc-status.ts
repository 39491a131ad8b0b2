/**
 * gRPC status codes and the error a stream ends with
 * (https://github.com/grpc/grpc/blob/master/doc/statuscodes.md). Their own
 * module, below both the transport interface (transport.ts) and liveness.ts,
 * which each need them and one of which imports the other.
 */

/** gRPC status codes used by Kanal (subset of grpc's codes). */
export enum GrpcStatus {
  OK = 0,
  CANCELLED = 1,
  UNKNOWN = 2,
  INVALID_ARGUMENT = 3,
  DEADLINE_EXCEEDED = 4,
  RESOURCE_EXHAUSTED = 8,
  FAILED_PRECONDITION = 9,
  UNIMPLEMENTED = 12,
  INTERNAL = 13,
  UNAVAILABLE = 14,
  UNAUTHENTICATED = 16,
}

/** Error carrying the gRPC status a stream ended with. */
export class GrpcStatusError extends Error {
  override name = 'GrpcStatusError';
  /** `cause`: the socket or TLS error behind it, for callers that tell failures apart (a refused connection). */
  constructor(
    readonly code: GrpcStatus,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}
