/**
 * The order /status pages through and its cursors (src/server/status-index.ts):
 * a walk from any cursor never repeats an agent, survives agents that come and
 * go between pages, tells apart two credentials of one subject, and a cursor
 * the server did not make is refused rather than read.
 */
import test from 'ava';
import { decodeCursor, encodeCursor, startAfter, type IndexedAgent } from '../../src/server/status-index.js';

function agent(tenant: string | undefined, agentID: string, subject: string, key = `x509\n${subject}`): IndexedAgent {
  return { tenant, agentID, credential: { key, subject }, backends: [], detached: [] };
}

const sorted = [
  agent('a', 'n1', 'CN=n1'),
  agent('a', 'n2', 'CN=shared', 'token\nuid-1'),
  agent('a', 'n2', 'CN=shared', 'token\nuid-2'),
  agent('b', 'n1', 'CN=n1'),
].sort((x, y) => (encodeCursor(x) < encodeCursor(y) ? -1 : 1));

test('pages cut at every place show each agent once, even two credentials of one subject', (t) => {
  // Re-sort as the index does: tenant, agentID, subject, then the order of the key digests.
  const order = [...sorted].sort((x, y) => {
    const a = [x.tenant ?? '', x.agentID, x.credential.subject];
    const b = [y.tenant ?? '', y.agentID, y.credential.subject];
    return a.join('\0') < b.join('\0') ? -1 : a.join('\0') > b.join('\0') ? 1 : 0;
  });
  for (let size = 1; size <= order.length; size++) {
    const seen: IndexedAgent[] = [];
    let from = 0;
    for (let pages = 0; pages < 10 && from < order.length; pages++) {
      const page = order.slice(from, from + size);
      seen.push(...page);
      const cursor = decodeCursor(encodeCursor(page[page.length - 1]));
      if (!cursor) throw new Error('a cursor of ours did not decode');
      from = startAfter(order, cursor);
    }
    t.is(new Set(seen).size, seen.length, `page size ${size}: no agent twice`);
  }
});

test('an agent gone between pages does not lose the ones after it; one added before the cursor is not shown again', (t) => {
  const all = [agent(undefined, 'a', 's'), agent(undefined, 'b', 's'), agent(undefined, 'c', 's')];
  const cursor = decodeCursor(encodeCursor(all[1]));
  if (!cursor) throw new Error('no cursor');
  t.is(startAfter([all[0], all[2]], cursor), 1, 'b left: the walk goes on at c');
  t.is(startAfter([agent(undefined, 'a0', 's'), ...all], cursor), 3, 'a0 came: it sorts before the cursor');
});

test('a cursor this server did not make is refused', (t) => {
  for (const bad of ['', 'not base64 !', Buffer.from('[1,2,3,4]').toString('base64url'), Buffer.from('{"a":1}').toString('base64url')])
    t.is(decodeCursor(bad), undefined, JSON.stringify(bad));
});
