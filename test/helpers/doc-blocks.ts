/**
 * The shell blocks of the docs, run as written: every `sh` block of a page, or
 * one block marked `<!-- docs-test: NAME -->` on the line before its fence,
 * with its `NAME=value` lines set to what a test needs; and a bash run in a
 * process group of its own, so what a block starts in the background is
 * stopped with it.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Scope } from '../../kit/launch/cleanup-scope.js';
import { killOnExit } from '../../kit/launch/exit-cleanup.js';

/** The repository (this file runs from dist/test/helpers/). */
export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

export function readRepoFile(relative: string): string {
  return fs.readFileSync(path.join(REPO, relative), 'utf8');
}

/** Every ```sh block of a page, in order. */
export function shBlocks(page: string): string[] {
  return [...readRepoFile(page).matchAll(/```sh\n([\s\S]*?)```/g)].map((m) => m[1]);
}

/** The ```sh block right after `<!-- docs-test: name -->`; throws naming the page and the marker when it is missing. */
export function markedBlock(page: string, name: string): string {
  const marker = `<!-- docs-test: ${name} -->\n\`\`\`sh\n`;
  const text = readRepoFile(page);
  const at = text.indexOf(marker);
  if (at < 0) throw new Error(`${page}: no sh block after "<!-- docs-test: ${name} -->"`);
  const start = at + marker.length;
  return text.slice(start, text.indexOf('```', start));
}

/** Replaces each `NAME=...` line of a block with `NAME=value`; throws when the block has no such line. */
export function setVariables(block: string, values: Record<string, string>): string {
  let out = block;
  for (const [name, value] of Object.entries(values)) {
    const line = new RegExp(`^${name}=.*$`, 'm');
    if (!line.test(out)) throw new Error(`the block sets no ${name}=`);
    out = out.replace(line, `${name}='${value}'`);
  }
  return out;
}

export interface BashRun {
  /** Exit code, or null when a signal (the time limit) ended it. */
  code: number | null;
  /** stdout and stderr, interleaved. */
  output: string;
}

/**
 * Runs `script` with `bash -c` (strict mode: `set -euo pipefail` unless
 * `strict: false`) in its own process group, killed with the group after
 * timeoutMs; what the script left running in the background is killed when
 * bash exits (and by the scope).
 */
export function runBash(
  scope: Scope,
  script: string,
  opts: { cwd: string; timeoutMs: number; env?: NodeJS.ProcessEnv; strict?: boolean },
): Promise<BashRun> {
  const body = (opts.strict ?? true) ? `set -euo pipefail\n${script}` : script;
  const child = spawn('bash', ['-c', body], {
    cwd: opts.cwd,
    env: opts.env ?? process.env,
    detached: true,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const pgid = child.pid;
  const killGroup = (): void => {
    if (pgid === undefined) return;
    try {
      process.kill(-pgid, 'SIGKILL');
    } catch {
      // the group is gone
    }
  };
  if (pgid !== undefined) killOnExit.add(-pgid);
  scope.teardown(() => {
    killGroup();
    if (pgid !== undefined) killOnExit.delete(-pgid);
  });
  let output = '';
  child.stdout.setEncoding('utf8').on('data', (d: string) => (output += d));
  child.stderr.setEncoding('utf8').on('data', (d: string) => (output += d));
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      output += `\n[killed after ${opts.timeoutMs} ms]`;
      killGroup();
    }, opts.timeoutMs);
    child.on('error', (err) => (output += `\n[spawn error: ${err.message}]`));
    // What the block left running holds the output pipes open: it ends with bash.
    child.on('exit', killGroup);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, output });
    });
  });
}
