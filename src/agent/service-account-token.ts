/**
 * The agent's service account token (`--service-account-token-path`):
 * read afresh for every (re)connect, because the kubelet rotates projected
 * tokens in place; a missing, empty, oversized or unprintable file is an
 * error naming the file, so the agent never dials without the credential it
 * was told to present.
 */
import { closeSync, openSync, readSync } from 'node:fs';
import { open } from 'node:fs/promises';
import { FLAG } from './settings.js';

export class ServiceAccountTokenError extends Error {
  override readonly name = 'ServiceAccountTokenError';
}

/** Kubernetes tokens are ~1 KiB; anything near this is not a token. */
export const MAX_TOKEN_BYTES = 16 * 1024;

// gRPC metadata values are printable ASCII; a JWT is base64url and dots.
const PRINTABLE = /^[\x21-\x7e]+$/;

export class ServiceAccountTokenSource {
  constructor(readonly path: string) {
    if (!path) throw new RangeError(`${FLAG['service-account-token-path']} must not be empty`);
  }

  /** The token as it is in the file now (surrounding whitespace removed). */
  async read(): Promise<string> {
    let data: Buffer;
    try {
      const file = await open(this.path, 'r');
      try {
        // One byte more than allowed tells an oversized file from a full one.
        const buffer = Buffer.alloc(MAX_TOKEN_BYTES + 1);
        const { bytesRead } = await file.read(buffer, 0, buffer.length, 0);
        data = buffer.subarray(0, bytesRead);
      } finally {
        await file.close();
      }
    } catch (err) {
      throw this.unreadable(err as NodeJS.ErrnoException);
    }
    return this.token(data);
  }

  /** {@link read} for callers that need the token synchronously (the agent's connect options today). */
  readSync(): string {
    let data: Buffer;
    let fd: number | undefined;
    try {
      fd = openSync(this.path, 'r');
      const buffer = Buffer.alloc(MAX_TOKEN_BYTES + 1);
      data = buffer.subarray(0, readSync(fd, buffer, 0, buffer.length, 0));
    } catch (err) {
      throw this.unreadable(err as NodeJS.ErrnoException);
    } finally {
      if (fd !== undefined) closeSync(fd);
    }
    return this.token(data);
  }

  /** The `authorization` metadata value for the next connection: `Bearer <token>`. */
  async authorization(): Promise<string> {
    return `Bearer ${await this.read()}`;
  }

  private token(data: Buffer): string {
    if (data.length > MAX_TOKEN_BYTES)
      throw new ServiceAccountTokenError(`service account token file ${this.path} is larger than ${MAX_TOKEN_BYTES} bytes: not a token`);
    const token = data.toString('utf8').trim();
    if (token === '')
      throw new ServiceAccountTokenError(
        `service account token file ${this.path} (${FLAG['service-account-token-path']}) is empty; refusing to dial without a token`,
      );
    if (!PRINTABLE.test(token))
      throw new ServiceAccountTokenError(
        `service account token file ${this.path} contains whitespace or non-ASCII characters inside the token`,
      );
    return token;
  }

  private unreadable(e: NodeJS.ErrnoException): ServiceAccountTokenError {
    const why =
      e.code === 'ENOENT' ? 'does not exist (is the projected service account token volume mounted?)' : `cannot be read: ${e.message}`;
    return new ServiceAccountTokenError(`service account token file ${this.path} (${FLAG['service-account-token-path']}) ${why}`);
  }
}
