/** docs/flags.md: every command's settings, rendered from their tables (scripts/flag-docs.mjs writes it). */
import { agentSettings } from '../agent/settings.js';
import { serverSettings } from '../server/config/settings.js';
import { renderReference } from '../settings/reference.js';

export function flagsPage(): string {
  return [
    '# Flags',
    '',
    'Generated from the settings tables (src/server/config/settings.ts, src/agent/settings.ts) by `npm run docs:flags`;',
    'do not edit by hand. How a setting is declared and where its value goes: [architecture.md](architecture.md), "Settings".',
    '',
    renderReference('server', serverSettings),
    renderReference('agent', agentSettings),
  ].join('\n');
}
