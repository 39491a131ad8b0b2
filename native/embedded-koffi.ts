/**
 * Koffi's native module inside the `kanal` executable. The release bundle
 * (kit/release/bundle.ts) puts this module in place of koffi's
 * `src/static.js`, whose `loadStatic(pkg)` koffi calls first and whose null
 * makes it search the file system as usual; so outside the executable
 * nothing changes.
 *
 * process.dlopen needs a file: the prebuilt `.node` is written into a fresh
 * private directory (mkdtemp: mode 0700, unpredictable name), created
 * exclusively and read-only, loaded, then both are removed; the mapping
 * outlives the file. No other user can swap it between write and load.
 * https://nodejs.org/api/single-executable-applications.html#using-native-addons-in-the-injected-main-script
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import sea from 'node:sea';

/** The SEA asset holding koffi's prebuilt module for this platform (kit/release/package.ts puts it there). */
export const KOFFI_ASSET = 'koffi.node';

/** The platform the embedded module was built for, as koffi names it (`${process.platform}-${process.arch}`). */
const EMBEDDED_PLATFORM = 'linux-x64';

/** Writes `bytes` to a private file, loads it as a native module and removes the file and its directory. */
export function dlopenPrivately(bytes: Uint8Array, name: string): unknown {
  let dir: string;
  try {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kanal-native-'));
  } catch (err) {
    throw new Error(
      `cannot create a private directory for ${name} under ${os.tmpdir()} (set TMPDIR to a writable directory): ${String(err)}`,
      { cause: err },
    );
  }
  const file = path.join(dir, name);
  try {
    // 'wx': O_CREAT|O_EXCL, never follows or reuses what is there; 0o500: nobody writes it after this.
    fs.writeFileSync(file, bytes, { flag: 'wx', mode: 0o500 });
    const module = { exports: {} as unknown };
    try {
      process.dlopen(module, file);
    } catch (err) {
      throw new Error(
        `cannot load ${name} from ${dir} (is ${os.tmpdir()} mounted noexec? set TMPDIR to a directory that allows executables): ${String(err)}`,
        { cause: err },
      );
    }
    return module.exports;
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

/** koffi's loadStatic: the embedded module in the executable, else null (koffi then loads its own from node_modules). */
export function loadStatic(pkg: string): unknown {
  if (!sea.isSea() || pkg !== EMBEDDED_PLATFORM || !sea.getAssetKeys().includes(KOFFI_ASSET)) return null;
  return dlopenPrivately(new Uint8Array(sea.getRawAsset(KOFFI_ASSET)), KOFFI_ASSET);
}
