/**
 * The agent's service account token (`--service-account-token-path`, #14):
 * read afresh for every (re)connect, because the kubelet rotates projected
 * tokens in place; a missing, empty, oversized or unprintable file is an
 * error naming the file, so the agent never dials without the credential it
 * was told to present.
 */
import { open } from 'node:fs/promises';

export class ServiceAccountTokenError extends Error {
  override readonly name = 'ServiceAccountTokenError';
}

/** Kubernetes tokens are ~1 KiB; anything near this is not a token. */
export const MAX_TOKEN_BYTES = 16 * 1024;

// gRPC metadata values are printable ASCII; a JWT is base64url and dots.
const PRINTABLE = /^[\x21-\x7e]+$/;

export class ServiceAccountTokenSource {
  constructor(readonly path: string) {
    if (!path) throw new RangeError('--service-account-token-path must not be empty');
  }

  /** The token as it is in the file now (surrounding whitespace removed). */
  async read(): Promise<string> {
    let text: string;
    try {
      const file = await open(this.path, 'r');
      try {
        // One byte more than allowed tells an oversized file from a full one.
        const buffer = Buffer.alloc(MAX_TOKEN_BYTES + 1);
        const { bytesRead } = await file.read(buffer, 0, buffer.length, 0);
        if (bytesRead > MAX_TOKEN_BYTES) throw new ServiceAccountTokenError(`service account token file ${this.path} is larger than ${MAX_TOKEN_BYTES} bytes: not a token`);
        text = buffer.subarray(0, bytesRead).toString('utf8');
      } finally {
        await file.close();
      }
    } catch (err) {
      if (err instanceof ServiceAccountTokenError) throw err;
      const e = err as NodeJS.ErrnoException;
      const why = e.code === 'ENOENT' ? 'does not exist (is the projected service account token volume mounted?)' : `cannot be read: ${e.message}`;
      throw new ServiceAccountTokenError(`service account token file ${this.path} (--service-account-token-path) ${why}`);
    }
    const token = text.trim();
    if (token === '') throw new ServiceAccountTokenError(`service account token file ${this.path} (--service-account-token-path) is empty; refusing to dial without a token`);
    if (!PRINTABLE.test(token)) throw new ServiceAccountTokenError(`service account token file ${this.path} contains whitespace or non-ASCII characters inside the token`);
    return token;
  }

  /** The `authorization` metadata value for the next connection: `Bearer <token>`. */
  async authorization(): Promise<string> {
    return `Bearer ${await this.read()}`;
  }
}
