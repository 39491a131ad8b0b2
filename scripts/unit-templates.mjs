// Writes src/cli/install/unit-templates.ts from the unit files in systemd/ that `kanal install-node`
// installs; test/packaging/install-executable.test.ts fails while it is stale. Run: node scripts/unit-templates.mjs
import fs from 'node:fs';
import * as prettier from 'prettier';

const FILES = ['kanal-agent.service', 'kubelet.service.d/10-kanal.conf'];
const out = new URL('../src/cli/install/unit-templates.ts', import.meta.url);
const entries = FILES.map(
  (f) => `  ${JSON.stringify(f)}: ${JSON.stringify(fs.readFileSync(new URL(`../systemd/${f}`, import.meta.url), 'utf8'))},`,
);
const source = [
  '// Generated from systemd/ by scripts/unit-templates.mjs: edit the unit files there, then run it.',
  '// The bundled program carries the units, so the kanal executable, which has no package directory',
  '// (https://nodejs.org/api/single-executable-applications.html), installs the same bytes as the npm form.',
  '',
  '/** The files install-node installs, by their path under systemd/. */',
  'export const UNIT_TEMPLATES = {',
  ...entries,
  '} as const;',
  '',
].join('\n');
const options = { ...(await prettier.resolveConfig(out.pathname)), filepath: out.pathname };
fs.writeFileSync(out, await prettier.format(source, options));
