/**
 * docs/multi-tenant.md's first run on one machine works as written: the
 * tenants' CAs, agent-port certificates and tenants file its first block
 * makes pass --dry-run, and its second block's server and two agents come
 * up, carry a CONNECT through alpha's socket, and `kanal status` lists each
 * agent under its tenant, and beta's certificate under alpha's name is
 * refused with an audit line that names alpha. The page's ports become free ones.
 */
import test from 'ava';
import fs from 'node:fs';
import path from 'node:path';
import { freePort, kanalCommand } from '../../kit/launch/kanal-cli.js';
import { makeWorkspace } from '../helpers/kanal-processes.js';
import { markedBlock, runBash } from '../helpers/doc-blocks.js';

const PAGE = 'docs/multi-tenant.md';
/** The ports the page uses. */
const PORTS = [8091, 8092, 8093, 8094, 8095, 8096, 8097, 8098, 8000];

/** A shell word for `s`, single-quoted. */
function quoted(s: string): string {
  return `'${s.replaceAll("'", "'\\''")}'`;
}

/**
 * `kanal` for the page's blocks: the built CLI; `exec` for the processes a
 * block starts in the background, so that its `kill %N` reaches them.
 */
function kanalFunction(): string {
  const cli = kanalCommand().map(quoted).join(' ');
  return ['kanal() {', '  case $1 in', `    server|agent) exec ${cli} "$@" ;;`, `    *) ${cli} "$@" ;;`, '  esac', '}', ''].join('\n');
}

test("the two tenants' first run: files that pass --dry-run, two agents up, a CONNECT through alpha's socket, kanal status by tenant, a mismatch refused and audited", async (t) => {
  const ws = await makeWorkspace(t);
  const dir = path.join(ws.dir, 'two-tenants');
  fs.mkdirSync(dir);
  const cli = kanalCommand().map(quoted).join(' ');
  const files = await runBash(t, `kanal() { ${cli} "$@"; }\n${markedBlock(PAGE, 'two-tenants-files')}`, { cwd: dir, timeoutMs: 60_000 });
  t.is(files.code, 0, files.output);
  t.regex(files.output, /tenants\.yaml and its files check out/);

  let block = markedBlock(PAGE, 'two-tenants-run');
  for (const port of PORTS) {
    t.regex(block, new RegExp(`\\b${port}\\b`), `the block uses port ${port}`);
    block = block.replace(new RegExp(`\\b${port}\\b`, 'g'), String(await freePort()));
  }
  const run = await runBash(t, kanalFunction() + block, { cwd: dir, timeoutMs: 90_000 });
  t.is(run.code, 0, run.output);
  t.is([...run.output.matchAll(/ok: 1\/1 server tunnel\(s\) up/g)].length, 2, run.output);
  t.regex(run.output, /ok: 2 tenant\(s\)\ntenant alpha: 1 agent\(s\) connected\ntenant beta: 1 agent\(s\) connected/);
  t.regex(run.output, /^HTTP\/1\.1 200 Connection Established\r?$/m);
  t.regex(run.output, /^HTTP\/1\.0 200 OK\r?$/m);
  t.regex(run.output, /^alpha-node-1 +alpha +CN=alpha-node-1 \(issuer CN=alpha-ca\)/m);
  t.regex(run.output, /^beta-node-1 +beta +CN=beta-node-1 \(issuer CN=beta-ca\)/m);
  t.regex(run.output, /^\{.*"tenant":"alpha","event":"refused","refusal":"agent_tenant_mismatch".*\}$/m);
});
