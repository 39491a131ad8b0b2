/** `npm run build`'s step after tsc: the npm form's bundle, dist/bundle/cli/ (kit/release/bundle.ts, bundleNpm). */
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { bundleNpm } from './bundle.js';

// This file runs as dist/kit/release/write-npm-bundle.js.
const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
await bundleNpm(path.join(REPO, 'dist'));
