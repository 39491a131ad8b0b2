/**
 * `kanal version [-o text|json]`: Kanal's version, the commit it was built
 * from, its form (the single executable or the npm package) and the runtime
 * under it, for bug reports and for checking what a node runs.
 */
import type { Argv, InferredOptionTypes } from 'yargs';
import { buildInfo, type BuildInfo } from './build-info.js';
import { withExamples } from './help-examples.js';

export const versionFlags = {
  output: { alias: 'o', choices: ['text', 'json'] as const, default: 'text' as const, describe: 'Output format' },
} as const;

export type VersionArgs = InferredOptionTypes<typeof versionFlags>;

export interface VersionReport extends BuildInfo {
  /** `flags`: the Node options this process started with (src/cli/runtime-flags.ts), to check that a service runs with them. */
  readonly runtime: { readonly node: string; readonly v8: string; readonly openssl: string; readonly flags: readonly string[] };
}

export function versionReport(): VersionReport {
  const { node, v8, openssl } = process.versions;
  return { ...buildInfo(), runtime: { node, v8, openssl, flags: process.execArgv } };
}

export function versionBuilder(y: Argv): Argv<VersionArgs> {
  return withExamples(y.options(versionFlags), [{ what: 'The same as JSON', lines: ['$0 version -o json'] }]);
}

export function runVersion(args: VersionArgs): void {
  const r = versionReport();
  const text =
    args.output === 'json'
      ? JSON.stringify(r, null, 2)
      : [
          `kanal ${r.version}`,
          `commit:  ${r.commit}`,
          `form:    ${r.form === 'executable' ? 'single executable' : 'npm package'}`,
          `runtime: Node.js ${r.runtime.node} (V8 ${r.runtime.v8}, OpenSSL ${r.runtime.openssl})`,
          `flags:   ${r.runtime.flags.length > 0 ? r.runtime.flags.join(' ') : '(none)'}`,
        ].join('\n');
  process.stdout.write(`${text}\n`);
}
