/** Where the fuzzer's files are, from dist/test/fuzz/*.js or test/fuzz/*.ts alike. */
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
/** The repository root: dist/test/fuzz -> ../../.. */
export const ROOT = path.resolve(here, here.split(path.sep).includes('dist') ? '../../..' : '../..');
/** The committed seed corpus, one folder per target. */
export const CORPUS = path.join(ROOT, 'test', 'fuzz', 'corpus');
/** The compiled module listing the real targets. */
export const TARGETS_MODULE = new URL('./targets.js', import.meta.url).href;
