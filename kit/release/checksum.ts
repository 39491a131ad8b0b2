/** SHA-256 of a file, and the `sha256sum` line that `sha256sum -c` checks (GNU coreutils' format: hash, two spaces, name). */
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';

export function sha256File(file: string): string {
  const hash = createHash('sha256');
  const fd = fs.openSync(file, 'r');
  try {
    const buf = Buffer.allocUnsafe(1 << 20);
    for (let n = fs.readSync(fd, buf); n > 0; n = fs.readSync(fd, buf)) hash.update(buf.subarray(0, n));
  } finally {
    fs.closeSync(fd);
  }
  return hash.digest('hex');
}

/** `<sha256>  <basename>\n`: checked with `sha256sum -c` from the file's directory. */
export function sha256sumLine(file: string): string {
  return `${sha256File(file)}  ${path.basename(file)}\n`;
}
