/** The flag reference of a command as Markdown, derived from its table (docs/flags.md is this text; a test keeps them equal). */
import type { AnySetting, Scope, SettingTable } from './setting.js';
import { helpGroups } from './table.js';

function defaultText(s: AnySetting): string {
  const d = s.default;
  if (d === undefined || d === '' || (Array.isArray(d) && d.length === 0)) return '';
  const text = Array.isArray(d)
    ? d.join(',')
    : typeof d === 'string' || typeof d === 'number' || typeof d === 'boolean'
      ? String(d)
      : JSON.stringify(d);
  return `\`${text}\``;
}

const cell = (text: string): string => text.replace(/\|/g, '\\|');

/** How the reference marks a setting's scope (setting.ts, Scope); a process's setting goes unmarked. */
export const SCOPE_MARKS: Readonly<Record<Scope, string>> = {
  process: '',
  tenant: '*Per tenant.*',
  'process-and-tenant': '*Also per tenant.*',
  'one-cluster': '*One cluster only.*',
};

function describeCell(s: AnySetting): string {
  const mark = SCOPE_MARKS[s.scope ?? 'process'];
  return cell(mark ? `${s.describe} ${mark}` : s.describe);
}

/** One section per help group, a row per visible setting; the upstream flags Kanal ignores are listed by name at the end. */
export function renderReference(command: string, table: SettingTable): string {
  const lines = [`## \`kanal ${command}\``, ''];
  for (const [group, names] of helpGroups(table)) {
    lines.push(`### ${group}`, '', '| flag | type | default | what it does |', '|---|---|---|---|');
    for (const name of names) {
      const s = table[name];
      const type = `${s.type}${s.array ? ', repeatable' : ''}${s.choices ? `: ${s.choices.join(' \\| ')}` : ''}`;
      lines.push(`| \`--${name}\` | ${type} | ${defaultText(s)} | ${describeCell(s)} |`);
    }
    lines.push('');
  }
  const ignored = Object.entries(table).filter(([, s]) => s.notice !== undefined);
  if (ignored.length > 0) {
    lines.push(
      '### Upstream flags accepted and ignored',
      '',
      'Named once in the log when given; why each is ignored: [upstream-flags.md](upstream-flags.md).',
      '',
    );
    lines.push(ignored.map(([name]) => `\`--${name}\``).join(', '), '');
  }
  return lines.join('\n');
}
