// Writes docs/architecture.md's file tables from the tree (run after `npm run build`); test/packaging/architecture-docs.test.ts checks they are current.
import fs from 'node:fs';
import { fileURLToPath } from 'node:url';
import { architectureFiles, withGenerated } from '../dist/test/packaging/architecture-page.js';

const repo = fileURLToPath(new URL('..', import.meta.url));
const file = new URL('../docs/architecture.md', import.meta.url);
const page = architectureFiles(repo);
fs.writeFileSync(file, withGenerated(fs.readFileSync(file, 'utf8'), page.markdown));
if (page.withoutComment.length > 0) console.warn(`no top-of-file comment (add a one-line one): ${page.withoutComment.join(', ')}`);
