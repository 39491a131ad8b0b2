/**
 * The facts a build records about itself: Kanal's version (package.json) and
 * the commit it was built from, `-dirty` when tracked files had changes (as
 * `git describe --dirty`), `unknown` without git. The executable carries them
 * as a SEA asset, the npm form as dist/build-info.json (src/cli/build-info.ts).
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

export interface BuildFacts {
  readonly version: string;
  readonly commit: string;
}

function git(repo: string, args: readonly string[]): string | undefined {
  const r = spawnSync('git', ['-C', repo, ...args], { encoding: 'utf8', timeout: 30_000 });
  return r.status === 0 ? r.stdout.trim() : undefined;
}

/** HEAD, with `-dirty` when a tracked file differs from it (untracked files do not count); `unknown` outside git. */
export function gitCommit(repo: string): string {
  const head = git(repo, ['rev-parse', 'HEAD']);
  if (head === undefined || !/^[0-9a-f]{40,64}$/.test(head)) return 'unknown';
  const status = git(repo, ['status', '--porcelain', '--untracked-files=no']);
  return status === undefined || status !== '' ? `${head}-dirty` : head;
}

export function packageVersion(repo: string): string {
  const pkg = JSON.parse(fs.readFileSync(path.join(repo, 'package.json'), 'utf8')) as { version?: unknown };
  if (typeof pkg.version !== 'string') throw new Error(`${repo}/package.json has no "version"`);
  return pkg.version;
}

export function buildFacts(repo: string): BuildFacts {
  return { version: packageVersion(repo), commit: gitCommit(repo) };
}

export function writeBuildFacts(file: string, facts: BuildFacts): void {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, `${JSON.stringify(facts, null, 2)}\n`);
}
