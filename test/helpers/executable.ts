/**
 * The single executable for tests: dist/release/kanal, built by
 * kit/release/package.ts when it is missing or older than anything in
 * dist/src or dist/native. ava runs test files in several processes; a lock
 * directory (mkdir is atomic) lets one build while the others wait for it.
 */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { run } from '../../kit/launch/run-to-end.js';

/** This file runs as dist/test/helpers/executable.js. */
const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const RELEASE = path.join(REPO, 'dist', 'release');
const EXECUTABLE = path.join(RELEASE, 'kanal');
const LOCK = path.join(RELEASE, '.build.lock');
const PACKAGE_SCRIPT = path.join(REPO, 'dist', 'kit', 'release', 'package.js');
const BUILD_TIMEOUT_MS = 300_000;

/** The newest modification time of any file under dir (0 when there is none). */
function newestMtime(dir: string): number {
  let newest = 0;
  if (!fs.existsSync(dir)) return newest;
  for (const entry of fs.readdirSync(dir, { withFileTypes: true, recursive: true })) {
    if (entry.isFile()) newest = Math.max(newest, fs.statSync(path.join(entry.parentPath, entry.name)).mtimeMs);
  }
  return newest;
}

function isFresh(): boolean {
  if (!fs.existsSync(EXECUTABLE)) return false;
  const built = fs.statSync(EXECUTABLE).mtimeMs;
  return built >= newestMtime(path.join(REPO, 'dist', 'src')) && built >= newestMtime(path.join(REPO, 'dist', 'native'));
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** Takes the lock, or removes it when its holder died; false while a live process holds it. */
function tryLock(): boolean {
  try {
    fs.mkdirSync(LOCK);
    fs.writeFileSync(path.join(LOCK, 'pid'), String(process.pid));
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    let holder: number;
    try {
      holder = Number(fs.readFileSync(path.join(LOCK, 'pid'), 'utf8'));
    } catch {
      // Created a moment ago, pid not written yet: a live holder.
      return false;
    }
    if (Number.isInteger(holder) && !alive(holder)) fs.rmSync(LOCK, { recursive: true, force: true });
    return false;
  }
}

let built: Promise<string> | undefined;

async function build(): Promise<string> {
  fs.mkdirSync(RELEASE, { recursive: true });
  const deadline = Date.now() + BUILD_TIMEOUT_MS;
  while (!tryLock()) {
    if (Date.now() > deadline) throw new Error(`${LOCK} held for ${BUILD_TIMEOUT_MS} ms; remove it if no build is running`);
    await sleep(200);
  }
  try {
    if (isFresh()) return EXECUTABLE;
    if (!fs.existsSync(PACKAGE_SCRIPT)) throw new Error(`${PACKAGE_SCRIPT} is missing: run npm run build`);
    const r = await run(process.execPath, [PACKAGE_SCRIPT], { timeoutMs: BUILD_TIMEOUT_MS, cwd: REPO });
    if (r.code !== 0) throw new Error(`building the executable failed (exit ${r.code ?? r.signal}):\n${r.stderr}${r.stdout}`);
    return EXECUTABLE;
  } finally {
    fs.rmSync(LOCK, { recursive: true, force: true });
  }
}

/** The absolute path of dist/release/kanal, built once per test process when missing or stale. */
export async function kanalExecutable(): Promise<string> {
  built ??= build().catch((err: unknown) => {
    built = undefined;
    throw err;
  });
  return built;
}
