/**
 * Which `kanal` install-node sets up. Two forms run the same code: the npm
 * package (npm puts `kanal` on PATH; `npm install --global --prefix
 * /usr/local` makes it /usr/local/bin/kanal) and the kanal executable (`npm
 * run package`: a Node.js single executable application,
 * https://nodejs.org/api/single-executable-applications.html), which installs
 * itself by copying its own file there.
 */
import { isSea } from 'node:sea';

/** The program the units' ExecStart runs (systemd/kanal-agent.service, systemd/kanal-server.service). */
export const KANAL_BINARY = '/usr/local/bin/kanal';

/** How this process runs: the single executable (its file is `path`), or the npm package under a Node.js. */
export type ProgramForm = { kind: 'executable'; path: string } | { kind: 'npm' };

export function programForm(): ProgramForm {
  // process.execPath is the executable itself in a single executable application.
  return isSea() ? { kind: 'executable', path: process.execPath } : { kind: 'npm' };
}
