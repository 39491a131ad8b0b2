/**
 * The single executable: Node's own `--build-sea` copies the running node
 * binary and injects the bundled script and its assets into it.
 * https://nodejs.org/api/single-executable-applications.html#generating-single-executable-applications-with---build-sea
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

export interface SeaOptions {
  /** The bundled ES module (kit/release/bundle.ts). */
  readonly main: string;
  readonly output: string;
  /** Asset name -> file, read at run time with node:sea's getAsset/getRawAsset. */
  readonly assets: Readonly<Record<string, string>>;
  /** V8's code cache of the main script, made at build time: less compiling at start. */
  readonly useCodeCache: boolean;
  /** Node options the executable always starts with. */
  readonly execArgv: readonly string[];
  /** The node binary to copy; the one running this build by default. */
  readonly executable?: string;
}

/** The SEA configuration file's contents (the fields of the page above). */
export function seaConfig(o: SeaOptions): Record<string, unknown> {
  return {
    main: o.main,
    mainFormat: 'module',
    output: o.output,
    executable: o.executable ?? process.execPath,
    disableExperimentalSEAWarning: true,
    useCodeCache: o.useCodeCache,
    // Snapshots need a CommonJS main; ours is an ES module (see docs/executable.md).
    useSnapshot: false,
    execArgv: [...o.execArgv],
    // NODE_OPTIONS still applies; extra Node options on the command line would be Kanal's flags.
    execArgvExtension: 'env',
    assets: { ...o.assets },
  };
}

/** Writes the configuration beside the output and runs `node --build-sea`; throws with node's output when it fails. */
export function buildSea(o: SeaOptions): void {
  const configFile = `${o.output}.sea-config.json`;
  fs.mkdirSync(path.dirname(o.output), { recursive: true });
  fs.rmSync(o.output, { force: true });
  fs.writeFileSync(configFile, `${JSON.stringify(seaConfig(o), null, 2)}\n`);
  const r = spawnSync(process.execPath, ['--build-sea', configFile], { encoding: 'utf8', timeout: 300_000 });
  fs.rmSync(configFile, { force: true });
  if (r.status !== 0 || !fs.existsSync(o.output)) {
    const why = r.error ? r.error.message : `exit ${r.status ?? r.signal}`;
    throw new Error(`node --build-sea failed (${why}):\n${r.stderr}${r.stdout}`);
  }
  fs.chmodSync(o.output, 0o755);
}
