/**
 * The admin port under the attack that made /status hold gigabytes: 500
 * agents announcing the largest identifiers the server accepts (64 host
 * names of 253 characters), then 30 connections of the real `nobody` user
 * that send GET /status and never read. The answer is a page of at most
 * about 1 MiB shared by its callers, so the server's memory barely moves
 * (before: 25 MiB per answer and +1.7 GiB for 30 non-readers at 1,500
 * agents); connections past one address's share are closed; /healthz, an
 * honest agent's traffic and an operator's /status from another address are
 * served meanwhile; the pages list every agent exactly once, and
 * `kanal status` walks them (--agent, --limit).
 */
import test from 'ava';
import fs from 'node:fs';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import {
  echoRoundTrip,
  httpGet,
  runCli,
  scrapeMetrics,
  startEchoBackend,
  startProxy,
  tunnelThrough,
  waitUntil,
} from '../helpers/kanal-processes.js';
import { agentChannel } from '../helpers/raw-agent.js';
import { skippedBecause } from '../helpers/skipped.js';
import { spawnChild } from '../../kit/launch/child.js';
import { AGENT_SERVICE_CONNECT, MD_AGENT_ID, MD_AGENT_IDENTIFIERS } from '../../src/wire/metadata.js';
import { MAX_STATUS_PAGE_BYTES } from '../../src/domain/status-query.js';
import type { ServerStatusDocument } from '../../src/domain/status-document.js';
import http from 'node:http';

const AGENTS = 500;
const NON_READERS = 30;
/** --http-max-connections' default (32): one address holds a quarter of it. */
const PER_ADDRESS = 8;
/** Far above what a shared page costs, far below what 30 copies of the whole table did (about 1 MiB per agent here). */
const RSS_GROWTH_BOUND = 150 * 1024 * 1024;

const notRoot =
  typeof process.getuid === 'function' && process.getuid() !== 0 ? 'not root: the non-readers run as the real nobody user' : undefined;

/** 64 host names of 253 characters, distinct per agent: the most an agent may announce. */
function largestIdentifiers(n: number): string {
  return Array.from({ length: 64 }, (_, k) => {
    const tag = `${n}-${k}`.padStart(12, '0');
    return `host=${'a'.repeat(63)}.${'b'.repeat(63)}.${'c'.repeat(63)}.${tag}${'d'.repeat(61 - tag.length)}`;
  }).join('&');
}

function rssBytes(pid: number): number {
  return Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? NaN) * 1024;
}

/** GET from a chosen source address (127.0.0.1 is the non-readers'). */
function getFrom(port: number, urlPath: string, localAddress: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.get({ host: '127.0.0.1', port, path: urlPath, localAddress, agent: false, timeout: 20_000 }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString() }));
    });
    req.on('timeout', () => req.destroy(new Error(`no answer from ${urlPath}`)));
    req.on('error', reject);
  });
}

if (notRoot) skippedBecause('/status under 30 non-reading nobody connections', notRoot);
else
  test('500 agents with the largest identifiers and 30 nobody connections that never read: memory bounded, everyone else served', async (t) => {
    t.timeout(240_000);
    const echo = await startEchoBackend(t);
    const { ws, server } = await startProxy(t, {
      // Dials to 127.0.0.1 go to the honest agent, which announces it (the attacker's agents answer none).
      server: { extraArgs: ['--max-agents-per-credential', String(AGENTS + 10), '--proxy-strategies', 'destHost'] },
      agents: [{ agentID: 'honest', extraArgs: ['--agent-identifiers', 'ipv4=127.0.0.1'] }],
    });
    // The attacker's agents: one credential, each tunnel on its own connection (the server admits two at a time per credential).
    const credential = { cert: ws.pki.agentCert, key: ws.pki.agentKey };
    for (let i = 0; i < AGENTS; i += 2) {
      await Promise.all(
        [i, i + 1].map(async (n) => {
          await agentChannel(t, ws, server, credential).openStream(
            AGENT_SERVICE_CONNECT,
            { [MD_AGENT_ID]: `attacker-${String(n).padStart(4, '0')}-${'n'.repeat(200)}`, [MD_AGENT_IDENTIFIERS]: largestIdentifiers(n) },
            20_000,
          );
        }),
      );
    }
    await waitUntil(
      async () => (await scrapeMetrics(server.healthPort)).get('kanal_server_agents') === AGENTS + 1,
      'every agent is registered',
      30_000,
    );

    // Every agent exactly once across the pages; each page bounded in bytes.
    const seen: string[] = [];
    let after: string | undefined;
    for (let pages = 0; pages < 100; pages++) {
      const r = await httpGet(`http://127.0.0.1:${server.adminPort}/status?limit=1000${after ? `&after=${after}` : ''}`, 20_000);
      t.is(r.status, 200, r.body.slice(0, 200));
      t.true(Buffer.byteLength(r.body) <= MAX_STATUS_PAGE_BYTES + 64 * 1024, `a page of ${Buffer.byteLength(r.body)} bytes`);
      const doc = JSON.parse(r.body) as ServerStatusDocument;
      t.is(doc.page.matched, AGENTS + 1);
      seen.push(...doc.agents.map((a) => a.agentID));
      after = doc.page.next;
      if (!after) break;
    }
    t.is(seen.length, AGENTS + 1, 'every agent once');
    t.is(new Set(seen).size, AGENTS + 1, 'no agent twice');
    t.true(seen.includes('honest'));

    const before = rssBytes(server.pid);
    // The non-readers: one process of the real nobody user with 30 connections, each sends GET /status and never reads.
    const dir = fs.mkdtempSync('/tmp/kanal-nonreader-');
    t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
    fs.chmodSync(dir, 0o755);
    const script = path.join(dir, 'nonreader.cjs');
    fs.writeFileSync(
      script,
      `const net = require('net'); let opened = 0, closed = 0;
       for (let i = 0; i < ${NON_READERS}; i++) {
         const s = net.connect(${server.adminPort}, '127.0.0.1', () => { opened++; s.write('GET /status HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n'); s.pause(); report(); });
         s.on('error', () => undefined); s.on('close', () => { closed++; report(); });
       }
       function report() { console.log(JSON.stringify({ opened, closed })); }
       setInterval(() => undefined, 1000);`,
    );
    fs.chmodSync(script, 0o644);
    const nobody = spawnChild(t, {
      name: 'nonreaders',
      argv: ['setpriv', '--reuid=nobody', '--regid=nogroup', '--clear-groups', process.execPath, script],
      logFile: path.join(dir, 'nonreaders.log'),
    });
    const refusedFull = async (): Promise<number> =>
      (await scrapeMetrics(server.healthPort)).get('kanal_refusals_total{reason="http_port_full"}') ?? 0;
    await waitUntil(
      async () => (await refusedFull()) >= NON_READERS - PER_ADDRESS,
      'the connections past one address share are refused',
      30_000,
    );

    // Meanwhile: the health port, an honest agent's traffic, and the operator from another address.
    t.is((await httpGet(`http://127.0.0.1:${server.healthPort}/healthz`, 10_000)).status, 200);
    t.true(
      await echoRoundTrip(await tunnelThrough(t, server, echo.address), randomBytes(100_000)),
      "the honest agent's tunnel carries bytes",
    );
    const operator = await getFrom(server.adminPort, '/status?agent=honest', '127.0.0.2');
    t.is(operator.status, 200);
    t.deepEqual(
      (JSON.parse(operator.body) as ServerStatusDocument).agents.map((a) => a.agentID),
      ['honest'],
    );
    const growth = rssBytes(server.pid) - before;
    t.log(`server RSS ${Math.round(before / 1048576)} MiB before the non-readers, growth ${Math.round(growth / 1048576)} MiB`);
    t.true(growth < RSS_GROWTH_BOUND, `RSS grew ${Math.round(growth / 1048576)} MiB`);
    // The share is the address's: a connection of the test's own left kept alive may hold one of its places.
    t.true((await refusedFull()) <= NON_READERS - PER_ADDRESS + 1, 'only the connections past the share');
    await nobody.kill();

    // kanal status walks the pages, or is narrowed.
    const admin = ['status', '--admin-address', `127.0.0.1:${server.adminPort}`];
    const all = await runCli([...admin, '-o', 'json'], 60_000);
    t.is(all.code, 0, all.stderr);
    t.is((JSON.parse(all.stdout) as ServerStatusDocument).agents.length, AGENTS + 1);
    const one = await runCli([...admin, '--agent', 'honest']);
    t.is(one.code, 0, one.stderr);
    t.regex(one.stdout, /1 agent\(s\), 1 tunnel\(s\)/);
    const ten = await runCli([...admin, '--limit', '10', '-o', 'json']);
    t.is(ten.code, 0, ten.stderr);
    t.is((JSON.parse(ten.stdout) as ServerStatusDocument).agents.length, 10);
    t.regex(ten.stderr, new RegExp(`showing 10 of ${AGENTS + 1} agent\\(s\\) \\(--limit\\)`));
  });
