/** `npm run build`'s last step: dist/build-info.json, the npm form's commit for `kanal version` (not committed). */
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { buildFacts, writeBuildFacts } from './build-info.js';

// This file runs as dist/kit/release/write-build-info.js.
const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
writeBuildFacts(path.join(REPO, 'dist', 'build-info.json'), buildFacts(REPO));
