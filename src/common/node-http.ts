/**
 * node:http, taken as its CommonJS exports. Importing it as an ES module makes
 * Node build the module's ES facade, which reads every export once, and the
 * WebSocket, CloseEvent and MessageEvent getters among them load Node's bundled
 * undici: ≈ 50 ms of CPU at every start on Node 26, for classes Kanal never
 * uses (bench/RESULTS.md, "a start close to a Go binary"). The exports are the
 * same objects either way.
 * https://nodejs.org/api/process.html#processgetbuiltinmoduleid
 */
export const http = process.getBuiltinModule('node:http');
