/**
 * docs/architecture.md is held to the tree: its generated file tables are
 * what architecture-page.ts renders now, every source file has the comment
 * that gives its line, and the hand-drawn layer diagram lists the layers of
 * layers.ts in their order.
 */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import test from 'ava';
import { BEGIN, COMMAND, END, architectureFiles, firstSentence, leadingComment, oneLine, withGenerated } from './architecture-page.js';
import { LAYERS } from './layers.js';

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const DOC = path.join(REPO, 'docs', 'architecture.md');

test(`docs/architecture.md's file tables are the tree's (run \`${COMMAND}\` after adding, moving or describing a file)`, (t) => {
  const committed = fs.readFileSync(DOC, 'utf8');
  const page = architectureFiles(REPO);
  const current = withGenerated(committed, page.markdown);
  const was = committed.split('\n');
  const line = current.split('\n').findIndex((text, i) => text !== was[i]);
  t.true(committed === current, `docs/architecture.md's file tables are stale from line ${line + 1}: run \`${COMMAND}\``);
  t.deepEqual(page.withoutComment, [], 'these files open with no comment: add a one-line one saying what the file is');
});

test('every folder of the layers and every source file is in the generated part, each once', (t) => {
  const { markdown } = architectureFiles(REPO);
  const headings = [...markdown.matchAll(/^#### `(.+)\/`$/gm)].map((m) => m[1]);
  t.is(new Set(headings).size, headings.length);
  for (const folder of LAYERS.flat()) t.true(headings.includes(folder), `${folder} has no table`);
  t.true(headings.includes('src/transport/h2') && headings.includes('src/server/tenants'), 'subfolders have tables of their own');
  const rows = [...markdown.matchAll(/^\| `([^`]+\.ts)` \|/gm)].length;
  t.true(rows > 200, `only ${rows} files listed`);
  // src/server's rooms keep their order: identity below routing below the assembly below config.
  const at = (dir: string): number => headings.indexOf(dir);
  t.true(
    at('src/server/identity') < at('src/server/routing') &&
      at('src/server/routing') < at('src/server') &&
      at('src/server') < at('src/server/config'),
  );
});

test('two renderings of one tree are one page', (t) => {
  t.is(architectureFiles(REPO).markdown, architectureFiles(REPO).markdown);
});

test("the layer diagram lists src/'s and native/'s layers top first, as layers.ts orders them", (t) => {
  const doc = fs.readFileSync(DOC, 'utf8');
  const diagram = /## Layers[\s\S]*?```\n([\s\S]*?)```/.exec(doc)?.[1];
  if (diagram === undefined) return t.fail('docs/architecture.md has no diagram under "## Layers"');
  // A row names its layer's folders before the description: "server/  agent/   the two processes…".
  const rows = diagram
    .split('\n')
    .filter((line) => /^\S/.test(line))
    .map((line) => [...line.matchAll(/(?:^|\s)(\S+)\/(?=\s)/g)].map((m) => (m[1] === '../native' ? 'native' : `src/${m[1]}`)).sort());
  const layers = LAYERS.filter((folders) => !folders[0].startsWith('kit/'))
    .map((folders) => [...folders].sort())
    .reverse();
  t.deepEqual(rows, layers);
});

test('a file line is the first sentence of the comment the file opens with', (t) => {
  t.is(oneLine('/** One. Two. */\nexport {};'), 'One.');
  t.is(
    oneLine('#!/usr/bin/env node\n// Shebang first, e.g. main.ts (not. this) `a. b` ends here. Not here.\n// more'),
    'Shebang first, e.g. main.ts (not. this) `a. b` ends here.',
  );
  t.is(oneLine('/**\n * Runs on\n * two lines: no full stop\n *\n * Second paragraph.\n */'), 'Runs on two lines: no full stop');
  t.is(oneLine("import x from 'y';\n/** Too late. */"), undefined);
  t.deepEqual(leadingComment('/** A. */'), ['A.']);
  t.is(firstSentence('Node.js runs it. Then.'), 'Node.js runs it.');
});

test('the generated part replaces only what lies between its markers', (t) => {
  const doc = `# Title\n\nprose\n\n${BEGIN}\nold\n${END}\n\nafter\n`;
  t.is(withGenerated(doc, `${BEGIN}\nnew\n${END}`), `# Title\n\nprose\n\n${BEGIN}\nnew\n${END}\n\nafter\n`);
  t.throws(() => withGenerated('# no markers', 'x'), { message: /lacks the markers/ });
});

/** Every file under the repository's source folders, as repository paths. */
function treeFiles(dir: string): string[] {
  return fs.readdirSync(path.join(REPO, dir), { withFileTypes: true }).flatMap((entry) => {
    const rel = `${dir}/${entry.name}`;
    return entry.isDirectory() ? treeFiles(rel) : [rel];
  });
}

test('every source file the hand-written part of docs/architecture.md names exists (after a move, fix the prose)', (t) => {
  const doc = fs.readFileSync(DOC, 'utf8');
  const prose = doc.slice(0, doc.indexOf(BEGIN));
  const files = ['src', 'native', 'kit', 'test', 'bench'].flatMap(treeFiles);
  const named = [...new Set([...prose.matchAll(/`([\w./-]+\.ts)`/g)].map((m) => m[1]))];
  t.true(named.length > 30, `only ${named.length} file names found in the prose`);
  const exists = (name: string): boolean =>
    name.includes('/') ? files.some((f) => f === name || f.endsWith(`/${name}`)) : files.some((f) => path.posix.basename(f) === name);
  t.deepEqual(
    named.filter((name) => !exists(name)),
    [],
    'docs/architecture.md names files that are not in the tree',
  );
});
