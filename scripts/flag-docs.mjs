// Writes docs/flags.md from the commands' settings tables (run after `npm run build`); test/settings/flag-docs.test.ts checks it is current.
import fs from 'node:fs';
import { flagsPage } from '../dist/src/cli/flags-page.js';

fs.writeFileSync(new URL('../docs/flags.md', import.meta.url), flagsPage());
