import fs from 'node:fs';

/** Reads a credential or config file, naming the flag in the error. */
export function readFlagFile(flag: string, path: string): Buffer {
  try {
    return fs.readFileSync(path);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    throw new Error(`--${flag} ${path}: cannot read (${code ?? (err as Error).message})`);
  }
}
