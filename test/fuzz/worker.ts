/**
 * Worker entry of the fuzzer (engine.ts runFuzz): loads the module that lists
 * the targets, runs the chosen one, and posts the FuzzResult back.
 */
import { parentPort, workerData } from 'node:worker_threads';
import { pathToFileURL } from 'node:url';
import { runEngine, type FuzzOptions, type FuzzTarget } from './engine.js';

const { opts, heartbeat } = workerData as { opts: FuzzOptions; heartbeat: SharedArrayBuffer };
const url = opts.module.startsWith('file:') ? opts.module : pathToFileURL(opts.module).href;
const mod = (await import(url)) as { targets?: readonly FuzzTarget[] };
const target = mod.targets?.find((t) => t.name === opts.target);
if (target === undefined) throw new Error(`no fuzz target named ${opts.target} in ${opts.module}`);
parentPort!.postMessage(runEngine(target, opts, heartbeat));
