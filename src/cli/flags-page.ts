/** docs/flags.md: every command's settings, rendered from their tables (scripts/flag-docs.mjs writes it). */
import { agentSettings } from '../agent/settings.js';
import { FLAG, serverSettings } from '../server/config/settings.js';
import { renderReference } from '../settings/reference.js';

export function flagsPage(): string {
  return [
    '# Flags',
    '',
    'Generated from the settings tables (src/server/config/settings.ts, src/agent/settings.ts) by `npm run docs:flags`;',
    'do not edit by hand. How a setting is declared and where its value goes: [architecture.md](architecture.md), "Settings".',
    '',
    `A server setting marked *Per tenant.* is a tenant's own: each entry of \`${FLAG['tenants-config']}\` sets it under the same name`,
    '(without the dashes), and the command line sets it only for a server of one cluster; *Also per tenant.*: the command',
    "line's value is the process's own and an entry may set the tenant's; *One cluster only.*: refused with the tenants file",
    '([multi-tenant.md](multi-tenant.md)).',
    '',
    renderReference('server', serverSettings),
    renderReference('agent', agentSettings),
  ].join('\n');
}
