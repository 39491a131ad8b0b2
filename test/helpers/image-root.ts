// The image's root file system without a container engine: the shared
// libraries of gcr.io/distroless/cc-debian12, taken from this machine's
// Debian 12 packages of the same names, plus what the Dockerfile's final
// stage COPYs; then a command run from that root as the image's USER.

import { copyFile, chmod, chown, mkdir, readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { run, type RunResult } from '../../kit/launch/run-to-end.js';
import type { CopyInstruction } from './dockerfile.js';

/**
 * Debian packages holding the shared libraries of gcr.io/distroless/cc-debian12:
 * base's libc6 and libssl3, and cc's libgcc-s1, libstdc++6, libgomp1
 * (https://github.com/GoogleContainerTools/distroless/blob/main/cc/config.bzl).
 */
export const BASE_LIBRARY_PACKAGES = ['libc6', 'libssl3', 'libgcc-s1', 'libstdc++6', 'libgomp1'] as const;

/** The directories the dynamic loader searches by default on Debian x86-64, and the ELF interpreter's. */
const LIBRARY_DIRS = ['/lib/x86_64-linux-gnu', '/usr/lib/x86_64-linux-gnu', '/lib64'];

/** Why this machine cannot stand in for the base image's Debian, or undefined. */
export async function hostUnfitReason(): Promise<string | undefined> {
  const version = await readFile('/etc/debian_version', 'utf8').catch(() => '');
  if (!version.startsWith('12')) return `this machine is not Debian 12 (/etc/debian_version: ${version.trim() || 'absent'})`;
  if (process.arch !== 'x64') return `the executable and the image are linux-x64; this machine is ${process.arch}`;
  return undefined;
}

/** Shared libraries (by path, as installed here) in the package's file list, in the loader's directories. */
export async function packageLibraries(pkg: string): Promise<string[]> {
  const r = await run('dpkg', ['-L', pkg], { timeoutMs: 30_000 });
  if (r.code !== 0) throw new Error(`dpkg -L ${pkg}: ${r.stderr.trim()} (install ${pkg} here: apt-get install ${pkg})`);
  return r.stdout.split('\n').filter((p) => LIBRARY_DIRS.includes(path.posix.dirname(p)) && /\.so(\.\d+)*$/.test(p));
}

export interface Needed {
  /** The name the executable asks for: a soname, or the interpreter's absolute path. */
  name: string;
  /** Where this machine's loader found it, or undefined ("not found"). */
  hostPath?: string;
}

/** What the executable loads, as ldd(1) lists it (the vDSO is the kernel's, not a file). */
export async function neededLibraries(executable: string): Promise<Needed[]> {
  const r = await run('ldd', [executable], { timeoutMs: 30_000 });
  if (r.code !== 0) throw new Error(`ldd ${executable}: ${r.stderr.trim() || r.stdout.trim()}`);
  const out: Needed[] = [];
  for (const line of r.stdout.split('\n').map((l) => l.trim())) {
    const arrow = /^(\S+) => (\S+)/.exec(line);
    if (arrow) out.push({ name: arrow[1], ...(arrow[2] === 'not' ? {} : { hostPath: arrow[2] }) });
    else if (line.startsWith('/')) out.push({ name: line.split(' ')[0], hostPath: line.split(' ')[0] });
  }
  return out.filter((n) => !n.name.startsWith('linux-vdso'));
}

export interface ImageRoot {
  /** Paths in the root (as the image has them) of every file placed there. */
  files: string[];
  /** Library names the executable needs that neither the base nor the Dockerfile provides. */
  missing: string[];
}

export interface AssembleOptions {
  root: string;
  /** The final stage's COPY instructions. */
  copies: readonly CopyInstruction[];
  /** Where a build-context source is on this machine (dist/release/kanal -> the built executable). */
  contextFile: (source: string) => string;
  /** The file ENTRYPOINT runs, as the image has it; its libraries are checked. */
  entrypoint: string;
  /** The USER the image runs as, uid:gid. */
  user: { uid: number; gid: number };
}

async function place(root: string, hostFile: string, imagePath: string, files: string[]): Promise<void> {
  const target = path.join(root, imagePath);
  await mkdir(path.dirname(target), { recursive: true });
  await copyFile(hostFile, target); // follows a symbolic link: the image gets the library under this name
  files.push(imagePath);
}

/**
 * Lays out the image's files in `root`: the base's libraries, /etc/passwd and
 * /tmp as distroless has them, and each COPY (--from a stage: the same path on
 * this machine, whose package the stage installs). Everything is root's, as
 * COPY makes it without --chown.
 */
export async function assembleImageRoot(opts: AssembleOptions): Promise<ImageRoot> {
  const files: string[] = [];
  for (const pkg of BASE_LIBRARY_PACKAGES) for (const lib of await packageLibraries(pkg)) await place(opts.root, lib, lib, files);
  for (const copy of opts.copies) {
    for (const source of copy.sources) {
      const hostFile = copy.from === undefined ? opts.contextFile(source) : source;
      const dest = copy.destination.endsWith('/') ? path.posix.join(copy.destination, path.posix.basename(source)) : copy.destination;
      await place(opts.root, hostFile, dest, files).catch((err: NodeJS.ErrnoException) => {
        throw new Error(
          `COPY ${copy.from ? `--from=${copy.from} ` : ''}${source} ${copy.destination}: ${hostFile}: ${err.code ?? err.message}`,
        );
      });
    }
  }
  // distroless's /etc/passwd, /etc/group, /tmp and home (https://github.com/GoogleContainerTools/distroless/blob/main/base/README.md).
  await mkdir(path.join(opts.root, 'etc'), { recursive: true });
  await writeFile(
    path.join(opts.root, 'etc/passwd'),
    'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n',
  );
  await writeFile(path.join(opts.root, 'etc/group'), 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n');
  await mkdir(path.join(opts.root, 'tmp'));
  await chmod(path.join(opts.root, 'tmp'), 0o1777);
  await mkdir(path.join(opts.root, 'home/nonroot'), { recursive: true });
  await chown(path.join(opts.root, 'home/nonroot'), opts.user.uid, opts.user.gid);
  await mkdir(path.join(opts.root, 'proc'));

  const present = new Set(files.filter((f) => LIBRARY_DIRS.includes(path.posix.dirname(f))).flatMap((f) => [f, path.posix.basename(f)]));
  const needed = await neededLibraries(path.join(opts.root, opts.entrypoint));
  const missing = needed
    .filter((n) => !present.has(n.name))
    .map((n) => (n.hostPath ? `${n.name} (here: ${n.hostPath})` : `${n.name} (not found here either)`));
  return { files, missing };
}

/**
 * argv from the root as `user`, in its own PID and mount namespace as in a
 * container: a fresh /proc (node reads /proc/self/exe), the root read-only with
 * a tmpfs on /tmp as the pods mount it (readOnlyRootFilesystem and an emptyDir),
 * and only distroless's PATH in the environment. The mounts go with the namespace.
 */
export function runInRoot(root: string, user: { uid: number; gid: number }, argv: readonly string[]): Promise<RunResult> {
  const script = [
    'set -e',
    'mount --bind "$0" "$0"',
    'mount -o remount,bind,ro "$0"',
    'mount -t tmpfs -o mode=1777,size=64m tmpfs "$0/tmp"',
    'mount -t proc proc "$0/proc"',
    `exec chroot --userspec=${user.uid}:${user.gid} "$0" "$@"`,
  ].join('\n');
  return run('unshare', ['--mount', '--pid', '--fork', '--propagation', 'private', 'sh', '-c', script, root, ...argv], {
    env: { PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' },
    timeoutMs: 60_000,
  });
}
