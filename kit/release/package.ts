/**
 * `npm run package`: dist/release/kanal, one linux-x64 file that runs Kanal
 * with nothing installed (Node.js, the bundled npm packages and koffi's
 * native module inside), with kanal.sha256 and the SBOM kanal.cdx.json beside
 * it. Steps: bundle dist/src, strip the node binary, inject (node --build-sea).
 * docs/executable.md says what is inside and why.
 *
 *   node dist/kit/release/package.js [--out DIR] [--no-code-cache] [--no-strip] [--exec-arg=--flag ...]
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { buildFacts, writeBuildFacts } from './build-info.js';
import { bundleCli } from './bundle.js';
import { sha256File, sha256sumLine } from './checksum.js';
import { buildSea } from './sea.js';
import { bundledPackages, lockHashes, npmComponents, sbom } from './sbom.js';
import { RUNTIME_FLAGS } from '../../src/cli/runtime-flags.js';

// This file runs as dist/kit/release/package.js.
export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

/** koffi's prebuilt module for glibc x64, from its platform package. */
const KOFFI_PACKAGE = '@koromix/koffi-linux-x64';
const KOFFI_NATIVE = 'linux_x64/koffi.node';

export interface PackageOptions {
  readonly outDir: string;
  readonly useCodeCache: boolean;
  /** Strip the copied node binary's symbols and debug info (the dynamic symbols Node-API addons link against stay). */
  readonly strip: boolean;
  readonly execArgv: readonly string[];
}

export const DEFAULT_OPTIONS: PackageOptions = {
  outDir: path.join(REPO, 'dist', 'release'),
  useCodeCache: true,
  strip: true,
  execArgv: RUNTIME_FLAGS,
};

/** A copy of the running node without symbol tables: a third smaller; a fatal C++ backtrace then shows addresses only. */
function strippedNode(work: string): string {
  const out = path.join(work, 'node');
  const r = spawnSync('strip', ['--strip-all', '-o', out, process.execPath], { encoding: 'utf8', timeout: 120_000 });
  if (r.status !== 0)
    throw new Error(`strip --strip-all ${process.execPath} failed (install binutils, or pass --no-strip): ${r.stderr || r.error?.message}`);
  return out;
}

/** Builds into a work directory and moves the executable into place last, so a reader never sees a half-written one. */
export async function packageKanal(o: PackageOptions = DEFAULT_OPTIONS): Promise<string> {
  if (process.platform !== 'linux' || process.arch !== 'x64')
    throw new Error(`the executable is built for linux-x64; this is ${process.platform}-${process.arch}`);
  const [major, minor] = process.versions.node.split('.').map(Number);
  if (major < 25 || (major === 25 && minor < 5)) {
    // --build-sea arrived in Node 25.5: https://nodejs.org/api/single-executable-applications.html
    throw new Error(
      `node ${process.versions.node} cannot build a single executable (needs 25.5 or later): run it with node_modules/.bin/node`,
    );
  }
  const dist = path.join(REPO, 'dist');
  if (!fs.existsSync(path.join(dist, 'src', 'cli', 'main.js')))
    throw new Error(`${dist}/src/cli/main.js is missing: run npm run build first`);
  const koffiDir = path.join(REPO, 'node_modules', KOFFI_PACKAGE);
  const koffiNode = path.join(koffiDir, KOFFI_NATIVE);
  if (!fs.existsSync(koffiNode)) throw new Error(`${koffiNode} is missing: npm ci installs koffi's platform package ${KOFFI_PACKAGE}`);

  fs.mkdirSync(o.outDir, { recursive: true });
  const work = fs.mkdtempSync(path.join(o.outDir, '.work-'));
  try {
    const facts = buildFacts(REPO);
    const infoFile = path.join(work, 'build-info.json');
    writeBuildFacts(infoFile, facts);
    const bundle = await bundleCli(dist, path.join(work, 'kanal.mjs'));
    const staged = path.join(work, 'kanal');
    buildSea({
      main: bundle.file,
      output: staged,
      executable: o.strip ? strippedNode(work) : process.execPath,
      assets: { 'koffi.node': koffiNode, 'build-info.json': infoFile },
      useCodeCache: o.useCodeCache,
      execArgv: o.execArgv,
    });

    const koffiVersion = (JSON.parse(fs.readFileSync(path.join(koffiDir, 'package.json'), 'utf8')) as { version: string }).version;
    const doc = sbom({
      facts,
      packages: bundledPackages(bundle.metafile, REPO),
      npm: npmComponents(REPO),
      lock: lockHashes(REPO),
      natives: [
        {
          source: `node_modules/${KOFFI_PACKAGE}/${KOFFI_NATIVE}`,
          sha256: sha256File(koffiNode),
          from: { name: KOFFI_PACKAGE, version: koffiVersion },
        },
      ],
      executableSha256: sha256File(staged),
    });
    const target = path.join(o.outDir, 'kanal');
    fs.writeFileSync(path.join(o.outDir, 'kanal.cdx.json'), `${JSON.stringify(doc, null, 2)}\n`);
    fs.writeFileSync(path.join(o.outDir, 'kanal.sha256'), sha256sumLine(staged));
    fs.renameSync(staged, target);
    return target;
  } finally {
    fs.rmSync(work, { recursive: true, force: true });
  }
}

function optionsFromArgv(argv: readonly string[]): PackageOptions {
  const { values } = parseArgs({
    args: [...argv],
    options: {
      out: { type: 'string' },
      'no-code-cache': { type: 'boolean', default: false },
      'no-strip': { type: 'boolean', default: false },
      'exec-arg': { type: 'string', multiple: true, default: [] },
    },
    strict: true,
  });
  return {
    outDir: values.out === undefined ? DEFAULT_OPTIONS.outDir : path.resolve(values.out),
    useCodeCache: !values['no-code-cache'],
    strip: !values['no-strip'],
    execArgv: [...DEFAULT_OPTIONS.execArgv, ...values['exec-arg']],
  };
}

if (process.argv[1] !== undefined && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const started = Date.now();
  packageKanal(optionsFromArgv(process.argv.slice(2))).then(
    (file) => process.stdout.write(`${file} (${(fs.statSync(file).size / 2 ** 20).toFixed(1)} MiB) in ${Date.now() - started} ms\n`),
    (err: unknown) => {
      process.stderr.write(`kanal package: ${err instanceof Error ? err.message : String(err)}\n`);
      process.exitCode = 1;
    },
  );
}
