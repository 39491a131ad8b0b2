/**
 * What this `kanal` is: its version, the commit it was built from, and its
 * form. The executable carries both in a SEA asset (kit/release/); the npm
 * form reads its version from package.json and its commit from
 * dist/build-info.json, which `npm run build` writes (`unknown` without it).
 * https://nodejs.org/api/single-executable-applications.html#seaissea
 */
import fs from 'node:fs';
import sea from 'node:sea';

/** The SEA asset and the file in dist/ that hold the build's facts. */
export const BUILD_INFO_FILE = 'build-info.json';

export type KanalForm = 'executable' | 'npm';

export interface BuildInfo {
  readonly version: string;
  /** `git rev-parse HEAD`, with `-dirty` when the tree had changes, or `unknown`. */
  readonly commit: string;
  readonly form: KanalForm;
}

/** The fields of a build-info.json, each `unknown` when missing or not a string. */
export function parseBuildInfo(text: string | undefined): { version: string; commit: string } {
  let parsed: unknown;
  try {
    parsed = text === undefined ? {} : JSON.parse(text);
  } catch {
    parsed = {};
  }
  const field = (name: string): string => {
    const v = typeof parsed === 'object' && parsed !== null ? (parsed as Record<string, unknown>)[name] : undefined;
    return typeof v === 'string' && v !== '' ? v : 'unknown';
  };
  return { version: field('version'), commit: field('commit') };
}

function readText(url: URL): string | undefined {
  try {
    return fs.readFileSync(url, 'utf8');
  } catch {
    return undefined;
  }
}

let cached: BuildInfo | undefined;

export function buildInfo(): BuildInfo {
  if (cached) return cached;
  if (sea.isSea()) {
    cached = {
      ...parseBuildInfo(sea.getAssetKeys().includes(BUILD_INFO_FILE) ? sea.getAsset(BUILD_INFO_FILE, 'utf8') : undefined),
      form: 'executable',
    };
  } else {
    // dist/src/cli/ -> package.json three levels up, dist/build-info.json two.
    const { version } = parseBuildInfo(readText(new URL('../../../package.json', import.meta.url)));
    const { commit } = parseBuildInfo(readText(new URL(`../../${BUILD_INFO_FILE}`, import.meta.url)));
    cached = { version, commit, form: 'npm' };
  }
  return cached;
}
