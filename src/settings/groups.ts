/**
 * Every --help heading and docs/flags.md section, declared once and in the
 * order both show them. A setting names one of these (Setting.group is
 * typed by this list), so a setting of a new kind adds its group here, where
 * its place among the others is decided (test/settings/settings.test.ts
 * checks that each is used and shown in this order).
 */
export const HELP_GROUPS = [
  'Server identity and HA',
  'Proxy server',
  'Agent port',
  'Agent authentication',
  'Authentication',
  'Server count (HA)',
  'Kubernetes API',
  "Frontend (the kube-apiserver's side)",
  'Routing and dials',
  'Dials and reconnects',
  'Node -> control plane (KEP-2025)',
  'Health and admin ports',
  'Limits',
  'Tunnel',
  'Logging',
  'Audit log',
  'Upstream flags Kanal ignores',
  'Command',
  // Sections of a tenant's entry in the tenants file (docs/multi-tenant.md), never on a command line.
  'Tenant',
  'Tenant-wide limits',
] as const;

export type HelpGroup = (typeof HELP_GROUPS)[number];

/** Where `group` is shown among the others. */
export function groupRank(group: HelpGroup): number {
  return HELP_GROUPS.indexOf(group);
}
