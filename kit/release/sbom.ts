/**
 * The executable's SBOM (CycloneDX 1.5 JSON, https://cyclonedx.org/docs/1.5/json/):
 * Kanal itself, every npm package esbuild actually put in the bundle (from its
 * metafile, with what `npm sbom` knows of each: purl, licence, hashes), the
 * Node.js runtime with its V8 and OpenSSL, and koffi's native module with its
 * SHA-256. Packages npm installs but the bundle never imports are left out.
 */
import { spawnSync } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import type { Metafile } from 'esbuild';
import type { BuildFacts } from './build-info.js';

export interface BundledPackage {
  readonly name: string;
  readonly version: string;
  /** Where it is installed, relative to the repository (node_modules/...): its key in package-lock.json. */
  readonly dir?: string;
  /** The SPDX expression of its package.json, when it has one. */
  readonly license?: string;
}

/** A CycloneDX component, as far as this file writes or reads one. */
export interface Component {
  readonly 'bom-ref'?: string;
  readonly type: string;
  readonly name: string;
  readonly version?: string;
  readonly purl?: string;
  readonly hashes?: readonly { alg: string; content: string }[];
  readonly properties?: readonly { name: string; value: string }[];
  readonly components?: readonly Component[];
  readonly [field: string]: unknown;
}

/** The package directory of a bundled file: the path up to its innermost `node_modules/<name>` or `node_modules/@scope/<name>`. */
function packageDir(input: string): string | undefined {
  const parts = input.split('/');
  const at = parts.lastIndexOf('node_modules');
  if (at < 0 || at + 1 >= parts.length) return undefined;
  const width = parts[at + 1].startsWith('@') ? 3 : 2;
  return parts.slice(0, at + width).join('/');
}

/** Every npm package with a file in the bundle, by name and the version its package.json gives. */
export function bundledPackages(metafile: Metafile, cwd: string): BundledPackage[] {
  const dirs = new Set<string>();
  for (const input of Object.keys(metafile.inputs)) {
    const dir = packageDir(input);
    if (dir !== undefined) dirs.add(dir);
  }
  const found = new Map<string, BundledPackage>();
  for (const dir of dirs) {
    const pkg = JSON.parse(fs.readFileSync(path.resolve(cwd, dir, 'package.json'), 'utf8')) as {
      name?: unknown;
      version?: unknown;
      license?: unknown;
    };
    if (typeof pkg.name !== 'string' || typeof pkg.version !== 'string') throw new Error(`${dir}/package.json: no name or version`);
    const license = typeof pkg.license === 'string' ? { license: pkg.license } : {};
    found.set(`${pkg.name}@${pkg.version}`, {
      name: pkg.name,
      version: pkg.version,
      dir: path.relative(cwd, path.resolve(cwd, dir)),
      ...license,
    });
  }
  return [...found.values()].sort((a, b) => a.name.localeCompare(b.name) || a.version.localeCompare(b.version));
}

/** `npm sbom`'s components for the production tree (npm >= 9.5), by name@version; empty when npm cannot say. */
export function npmComponents(repo: string): Map<string, Component> {
  const r = spawnSync('npm', ['sbom', '--sbom-format', 'cyclonedx', '--omit', 'dev'], {
    cwd: repo,
    encoding: 'utf8',
    timeout: 120_000,
    maxBuffer: 64 << 20,
  });
  const byRef = new Map<string, Component>();
  if (r.status !== 0) return byRef;
  const doc = JSON.parse(r.stdout) as { components?: Component[] };
  for (const c of doc.components ?? []) byRef.set(`${c.name}@${c.version ?? ''}`, c);
  return byRef;
}

function npmPurl(p: BundledPackage): string {
  const [scope, name] = p.name.startsWith('@') ? p.name.split('/') : [undefined, p.name];
  return `pkg:npm/${scope === undefined ? '' : `${encodeURIComponent(scope)}/`}${name}@${p.version}`;
}

/** The Node.js runtime the executable is made of, and the V8 and OpenSSL inside it. */
export function runtimeComponent(versions: NodeJS.ProcessVersions = process.versions): Component {
  return {
    'bom-ref': `node@${versions.node}`,
    type: 'platform',
    name: 'node',
    version: versions.node,
    purl: `pkg:generic/node@${versions.node}`,
    description: 'Node.js runtime: the executable is this node binary with the bundle injected',
    components: [
      { 'bom-ref': `v8@${versions.v8}`, type: 'library', name: 'v8', version: versions.v8, purl: `pkg:generic/v8@${versions.v8}` },
      {
        'bom-ref': `openssl@${versions.openssl}`,
        type: 'library',
        name: 'openssl',
        version: versions.openssl,
        purl: `pkg:generic/openssl@${versions.openssl}`,
      },
    ],
  };
}

/**
 * The tarball hash package-lock.json records for each installed package (its
 * `integrity`, https://docs.npmjs.com/cli/configuring-npm/package-lock-json),
 * by install path, as CycloneDX hashes.
 */
export function lockHashes(repo: string): Map<string, Component['hashes']> {
  const byDir = new Map<string, Component['hashes']>();
  let lock: { packages?: Record<string, { integrity?: unknown }> };
  try {
    lock = JSON.parse(fs.readFileSync(path.join(repo, 'package-lock.json'), 'utf8')) as typeof lock;
  } catch {
    return byDir;
  }
  const ALGS: Record<string, string> = { sha512: 'SHA-512', sha384: 'SHA-384', sha256: 'SHA-256', sha1: 'SHA-1' };
  for (const [dir, entry] of Object.entries(lock.packages ?? {})) {
    if (typeof entry.integrity !== 'string') continue;
    const hashes = entry.integrity
      .split(/\s+/)
      .map((sri) => /^(sha\d+)-(.+)$/.exec(sri))
      .flatMap((m) => (m && ALGS[m[1]] ? [{ alg: ALGS[m[1]], content: Buffer.from(m[2], 'base64').toString('hex') }] : []));
    if (hashes.length > 0) byDir.set(dir, hashes);
  }
  return byDir;
}

/** A package npm sbom did not list (it reads the lockfile's tree): what its own package.json and the lockfile say. */
function fromPackageJson(p: BundledPackage, hashes: Component['hashes']): Component {
  return {
    'bom-ref': `${p.name}@${p.version}`,
    type: 'library',
    name: p.name,
    version: p.version,
    purl: npmPurl(p),
    ...(p.license === undefined ? {} : { licenses: [{ expression: p.license }] }),
    ...(hashes === undefined ? {} : { hashes }),
  };
}

export interface NativeFile {
  /** Where the file came from, e.g. node_modules/@koromix/koffi-linux-x64/linux_x64/koffi.node. */
  readonly source: string;
  readonly sha256: string;
  /** The npm package that ships it. */
  readonly from: BundledPackage;
}

export interface SbomInput {
  readonly facts: BuildFacts;
  readonly packages: readonly BundledPackage[];
  readonly npm: ReadonlyMap<string, Component>;
  /** package-lock.json's hashes by install path (lockHashes), for packages npm sbom leaves out. */
  readonly lock?: ReadonlyMap<string, Component['hashes']>;
  readonly natives: readonly NativeFile[];
  readonly executableSha256: string;
  readonly versions?: NodeJS.ProcessVersions;
}

export function sbom(input: SbomInput): Record<string, unknown> {
  const { facts, npm } = input;
  const npmPackages: Component[] = [...input.packages, ...input.natives.map((n) => n.from)]
    .filter((p, i, all) => all.findIndex((q) => q.name === p.name && q.version === p.version) === i)
    .map((p) => npm.get(`${p.name}@${p.version}`) ?? fromPackageJson(p, p.dir === undefined ? undefined : input.lock?.get(p.dir)));
  const natives: Component[] = input.natives.map((n) => ({
    'bom-ref': `file:${n.source}`,
    type: 'file',
    name: path.basename(n.source),
    version: n.from.version,
    description: `native module of ${n.from.name}, embedded as a SEA asset and loaded at start (docs/executable.md)`,
    hashes: [{ alg: 'SHA-256', content: n.sha256 }],
    properties: [
      { name: 'kanal:source', value: n.source },
      { name: 'kanal:package', value: `${n.from.name}@${n.from.version}` },
    ],
  }));
  return {
    $schema: 'http://cyclonedx.org/schema/bom-1.5.schema.json',
    bomFormat: 'CycloneDX',
    specVersion: '1.5',
    serialNumber: `urn:uuid:${randomUUID()}`,
    version: 1,
    metadata: {
      timestamp: new Date().toISOString(),
      lifecycles: [{ phase: 'build' }],
      tools: { components: [{ type: 'application', name: 'kanal-release', version: facts.version }] },
      component: {
        'bom-ref': `kanal@${facts.version}`,
        type: 'application',
        name: 'kanal',
        version: facts.version,
        purl: `pkg:npm/kanal@${facts.version}`,
        hashes: [{ alg: 'SHA-256', content: input.executableSha256 }],
        properties: [{ name: 'kanal:commit', value: facts.commit }],
      },
    },
    components: [runtimeComponent(input.versions), ...npmPackages, ...natives],
  };
}
