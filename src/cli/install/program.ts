/**
 * Which `kanal` install-node sets up, and where its shipped files come from.
 * Two forms run the same code: the npm package (npm puts `kanal` on PATH,
 * `npm install --global --prefix /usr/local` makes it /usr/local/bin/kanal)
 * and the kanal executable (`npm run package`: a Node.js single executable
 * application, https://nodejs.org/api/single-executable-applications.html),
 * which installs itself by copying its own file there.
 */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { getAsset, isSea } from 'node:sea';

/** The program the units' ExecStart runs (systemd/kanal-agent.service, systemd/kanal-server.service). */
export const KANAL_BINARY = '/usr/local/bin/kanal';

/** How this process runs: the single executable (its file is `path`), or the npm package under a Node.js. */
export type ProgramForm = { kind: 'executable'; path: string } | { kind: 'npm' };

export function programForm(): ProgramForm {
  // process.execPath is the executable itself in a single executable application.
  return isSea() ? { kind: 'executable', path: process.execPath } : { kind: 'npm' };
}

/** The package root: dist/src/cli/install/ -> ../../../.. (the same in the repo and in an installed package). */
export function packageRoot(): string {
  return path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..', '..');
}

/**
 * A file shipped with Kanal (`systemd/kanal-agent.service`), by its path in
 * the package: read from `packageDir` when given, from the executable's
 * assets (sea.getAsset, keyed by that path) in the executable, else from
 * this package's files.
 */
export function shippedFile(relPath: string, packageDir?: string): Buffer {
  if (packageDir === undefined && isSea()) {
    try {
      return Buffer.from(getAsset(relPath));
    } catch {
      throw new Error(
        `this kanal executable carries no asset ${relPath}: rebuild it with npm run package (its SEA config lists the assets)`,
      );
    }
  }
  return fs.readFileSync(path.join(packageDir ?? packageRoot(), relPath));
}
