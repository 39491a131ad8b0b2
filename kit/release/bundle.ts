/**
 * The compiled CLI (dist/src) bundled by esbuild: as one ES module for the
 * single executable, and split into chunks for the npm form.
 *
 * The single executable's:
 * esbuild follows every static and literal dynamic import (the commands are
 * imported only when run, and their modules import others the same way), so
 * nothing is left to load from a file system the executable does not have.
 * https://esbuild.github.io/api/#bundle
 */
import { readFile, rm } from 'node:fs/promises';
import path from 'node:path';
import { build, type Metafile, type Plugin } from 'esbuild';

export interface Bundle {
  /** The bundled script. */
  readonly file: string;
  /** What went in: esbuild's metafile (inputs by path, with node_modules/<package>/... for dependencies). */
  readonly metafile: Metafile;
}

/**
 * koffi tries `loadStatic(pkg)` from its src/static.js before searching the
 * file system for its native module; ours (native/embedded-koffi.ts) loads the
 * copy embedded in the executable. The only change made to a dependency.
 */
function embeddedKoffi(loader: string): Plugin {
  return {
    name: 'kanal-embedded-koffi',
    setup(b) {
      b.onResolve({ filter: /^\.\/src\/static\.js$/ }, (args) =>
        args.importer.includes(`${path.sep}node_modules${path.sep}koffi${path.sep}`) ? { path: loader } : undefined,
      );
    },
  };
}

/**
 * node:http as its CommonJS exports for every module in the bundle, as
 * src/common/node-http.ts takes it: an ES import of it makes Node build its ES
 * facade, whose WebSocket getter loads Node's bundled undici (≈ 50 ms of CPU).
 * A bundle hoists every module's imports of built-ins to its top, so one
 * dependency importing node:http (the Kubernetes client's, though it loads
 * only on use) would cost every start that.
 */
const nodeHttpAsCommonJs: Plugin = {
  name: 'kanal-node-http-commonjs',
  setup(b) {
    b.onResolve({ filter: /^(node:)?http$/ }, () => ({ path: 'node:http', namespace: 'kanal-commonjs-builtin' }));
    b.onLoad({ filter: /.*/, namespace: 'kanal-commonjs-builtin' }, () => ({
      contents: "module.exports = process.getBuiltinModule('node:http');",
      loader: 'js',
    }));
  },
};

/**
 * string-width (yargs' and cliui's, for laying out help text) builds an
 * Intl.Segmenter and, from version 8, a /^\p{RGI_Emoji}$/v regular expression
 * when it loads: ≈ 35 ms of CPU at every start, which renders no help. Both are
 * made on first use instead; the build fails when a copy no longer has the
 * lines replaced, so an upgrade is looked at rather than silently slow.
 */
const STRING_WIDTH_EAGER: readonly { eager: string; lazy: string; required: boolean }[] = [
  {
    eager: 'const segmenter = new Intl.Segmenter();',
    lazy: 'let kanalSegmenter; const segmenter = { segment: (s) => (kanalSegmenter ??= new Intl.Segmenter()).segment(s) };',
    required: true,
  },
  {
    eager: 'const rgiEmojiRegex = /^\\p{RGI_Emoji}$/v;',
    lazy: "let kanalRgiEmoji; const rgiEmojiRegex = { test: (s) => (kanalRgiEmoji ??= new RegExp('^\\\\p{RGI_Emoji}$', 'v')).test(s) };",
    required: false,
  },
];

const lazyStringWidth: Plugin = {
  name: 'kanal-lazy-string-width',
  setup(b) {
    b.onLoad({ filter: /[\\/]node_modules[\\/](?:.*[\\/])?string-width[\\/]index\.js$/ }, async (args) => {
      let contents = await readFile(args.path, 'utf8');
      for (const { eager, lazy, required } of STRING_WIDTH_EAGER) {
        // A function, so the $ in the replacement is not one of replace()'s patterns.
        if (contents.includes(eager)) contents = contents.replace(eager, () => lazy);
        else if (required)
          return { errors: [{ text: `${args.path} no longer has "${eager}": look at kit/release/bundle.ts, lazyStringWidth` }] };
      }
      return { contents, loader: 'js' };
    });
  },
};

/**
 * CommonJS dependencies call require() for built-ins, which an ES module lacks;
 * in a single executable a require made this way loads built-ins only.
 * https://nodejs.org/api/single-executable-applications.html#requireid-in-the-injected-main-script-is-not-file-based
 */
const REQUIRE_SHIM =
  "import { createRequire as kanalCreateRequire } from 'node:module'; const require = kanalCreateRequire(import.meta.url);";

/** Bundles `dist/src/cli/main.js` of `distDir` into `outFile`; fails on any import esbuild cannot resolve. */
export async function bundleCli(dist: string, outFile: string): Promise<Bundle> {
  const distDir = path.resolve(dist);
  const result = await build({
    entryPoints: [path.join(distDir, 'src', 'cli', 'main.js')],
    outfile: outFile,
    bundle: true,
    platform: 'node',
    format: 'esm',
    target: 'node26',
    minify: false,
    sourcemap: false,
    legalComments: 'eof',
    metafile: true,
    logLevel: 'silent',
    banner: { js: REQUIRE_SHIM },
    plugins: [embeddedKoffi(path.join(distDir, 'native', 'embedded-koffi.js')), nodeHttpAsCommonJs, lazyStringWidth],
  });
  const problems = result.errors.map((e) => e.text);
  if (problems.length > 0) throw new Error(`esbuild could not bundle ${distDir}/src/cli/main.js:\n${problems.join('\n')}`);
  return { file: outFile, metafile: result.metafile };
}

/**
 * Where the npm form's bundle goes in dist/: as deep as dist/src/cli/, so the
 * paths src/cli/build-info.ts reads relative to its module (package.json,
 * dist/build-info.json) are the same from a chunk.
 */
export const NPM_BUNDLE_DIR = path.join('bundle', 'cli');

/**
 * The npm form (package.json's `bin`): the CLI bundled with the packages it
 * imports, split at every dynamic `import()` so a start reads and compiles
 * what the command it runs imports and nothing else (the Kubernetes client,
 * grpc-js, the other commands stay in chunks of their own until used). A start
 * of ~300 modules resolved, read and compiled one by one is then ~45 files
 * (bench/RESULTS.md, "a start close to a Go binary"). koffi stays external: it
 * finds its native module beside its own files in node_modules.
 * https://esbuild.github.io/api/#splitting
 */
export async function bundleNpm(dist: string): Promise<Bundle> {
  const distDir = path.resolve(dist);
  const outDir = path.join(distDir, NPM_BUNDLE_DIR);
  await rm(outDir, { recursive: true, force: true });
  const result = await build({
    entryPoints: [path.join(distDir, 'src', 'cli', 'main.js')],
    outdir: outDir,
    bundle: true,
    splitting: true,
    platform: 'node',
    format: 'esm',
    // The oldest Node.js the npm form runs on (package.json's engines).
    target: 'node22.19',
    minify: false,
    sourcemap: false,
    legalComments: 'eof',
    metafile: true,
    logLevel: 'silent',
    external: ['koffi'],
    banner: { js: REQUIRE_SHIM },
    plugins: [nodeHttpAsCommonJs, lazyStringWidth],
  });
  const problems = result.errors.map((e) => e.text);
  if (problems.length > 0) throw new Error(`esbuild could not bundle ${distDir}/src/cli/main.js:\n${problems.join('\n')}`);
  return { file: path.join(outDir, 'main.js'), metafile: result.metafile };
}
