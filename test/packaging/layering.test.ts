/**
 * The folder tree is the architecture: each folder is a layer and imports
 * only from the layers below it, never from a layer above nor from another
 * folder of its own layer. LAYERS is the one place the order is written
 * (docs/architecture.md explains it); a new folder must be placed in it
 * before anything in it can pass. Within a folder, files import each other
 * in one direction only: no circle of imports (import-graph.ts).
 */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import test from 'ava';
import { IMPORT, importCircles, importGraph } from './import-graph.js';

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

/** Bottom first. Folders are repository paths; a file belongs to the longest one that holds it. */
const LAYERS: readonly (readonly string[])[] = [
  ['native', 'src/wire'],
  ['src/common'],
  // Kanal's own terms that server and agent share: metrics and their label values, refusals, dial results.
  ['src/domain'],
  // The vocabulary of settings (a setting's kinds, its table's derived views); each command's table sits beside what it configures.
  ['src/settings'],
  ['src/transport'],
  ['src/tunnel'],
  // The audit log: the records tunnelled connections and dials make, their writer and its settings.
  ['src/audit'],
  ['src/kube'],
  ['src/server', 'src/agent'],
  ['src/cli'],
  // The demo's and tests' kit, outside the shipped package: nothing in the product may import it.
  ['kit/pki'],
  // One way to launch Kanal (in process from flags, or as a CLI child), one log reader, one cleanup scope.
  ['kit/launch'],
  // The demo, and the release build (the single executable): nothing imports either.
  ['kit/demo', 'kit/release'],
];

/**
 * Rooms of a folder, bottom first, like LAYERS one level down: a file in a
 * room imports only from lower rooms or its own ('.' is the folder's own
 * files). Every subfolder must be placed.
 */
const ROOMS: Readonly<Record<string, readonly (readonly string[])[]>> = {
  'src/server': [
    // Who a peer is (certificates, tokens, roles) and the server's leases: they need nothing else here.
    ['identity', 'leases'],
    // Which agent a dial goes to; where node -> control plane dials may go.
    ['routing', 'destinations'],
    // Agents joining, and the registry of those that did.
    ['agents'],
    // The kube-apiserver's side: HTTP CONNECT, gRPC, the Unix socket, dials through an agent.
    ['frontends'],
    // One cluster's room made of the above, whose a connection is, and the tenants file's reloads.
    ['tenants'],
    // A server's worker processes (docs/multi-tenant.md): the primary, the hand-off and relay of another worker's tenants.
    ['workers'],
    // KanalServer and its listeners.
    ['.'],
    // Settings and configuration, read by the CLI before the server is built.
    ['config'],
    // The one assembly: a command's configuration made complete options, for the CLI, the kit, the demo and the bench.
    ['assembly'],
  ],
};

/** The room of `file` inside `folder` ('.' for the folder's own files). */
function roomOf(folder: string, file: string): string {
  const rest = file.slice(folder.length + 1);
  return rest.includes('/') ? rest.slice(0, rest.indexOf('/')) : '.';
}

/** Every import between rooms of one folder that runs up or sideways, and every file in no room. */
function roomViolations(files: readonly string[], read: (file: string) => string): string[] {
  const problems: string[] = [];
  for (const [folder, rooms] of Object.entries(ROOMS)) {
    const rank = (room: string): number => rooms.findIndex((r) => r.includes(room));
    for (const file of files.filter((f) => f.startsWith(`${folder}/`))) {
      const from = roomOf(folder, file);
      if (rank(from) < 0) {
        problems.push(`${file}: room ${from} of ${folder} is not placed; add it to ROOMS (test/packaging/layering.test.ts)`);
        continue;
      }
      for (const match of read(file).matchAll(IMPORT)) {
        const spec = match[1];
        if (!spec.startsWith('.')) continue;
        const target = path.posix.normalize(path.posix.join(path.posix.dirname(file), spec));
        if (!target.startsWith(`${folder}/`)) continue;
        const to = roomOf(folder, target);
        if (to === from) continue;
        if (rank(to) > rank(from)) problems.push(`${file} imports ${spec}: room ${from} is below room ${to} of ${folder}`);
        else if (rank(to) === rank(from))
          problems.push(`${file} imports ${spec}: rooms ${from} and ${to} of ${folder} are one level and must not import each other`);
      }
    }
  }
  return problems;
}

/** What the package ships (package.json "files": dist/src, dist/native). */
const PRODUCT_ROOTS = ['src', 'native'];
const SOURCE_ROOTS = [...PRODUCT_ROOTS, 'kit'];

interface Placement {
  folder: string;
  rank: number;
}

function placementOf(file: string): Placement | undefined {
  let best: Placement | undefined;
  LAYERS.forEach((folders, rank) => {
    for (const folder of folders) {
      const inside = file === folder || file.startsWith(`${folder}/`);
      if (inside && (!best || folder.length > best.folder.length)) best = { folder, rank };
    }
  });
  return best;
}

function sourceFiles(dir: string): string[] {
  const out: string[] = [];
  for (const entry of fs.readdirSync(path.join(REPO, dir), { withFileTypes: true })) {
    const rel = `${dir}/${entry.name}`;
    if (entry.isDirectory()) out.push(...sourceFiles(rel));
    else if (entry.name.endsWith('.ts') && !entry.name.endsWith('.d.ts')) out.push(rel);
  }
  return out;
}

/** Every import that runs up the layers or sideways within one, as "file imports spec: why". */
function layerViolations(files: readonly string[], read: (file: string) => string): string[] {
  const problems: string[] = [];
  for (const file of files) {
    const from = placementOf(file);
    if (!from) {
      problems.push(`${file}: its folder is in no layer; place it in LAYERS (test/packaging/layering.test.ts)`);
      continue;
    }
    for (const match of read(file).matchAll(IMPORT)) {
      const spec = match[1];
      if (!spec.startsWith('.')) continue;
      const target = path.posix.normalize(path.posix.join(path.posix.dirname(file), spec));
      const to = placementOf(target);
      if (!to || to.folder === from.folder) continue;
      if (to.rank > from.rank) problems.push(`${file} imports ${spec}: ${from.folder} is below ${to.folder}`);
      else if (to.rank === from.rank)
        problems.push(`${file} imports ${spec}: ${from.folder} and ${to.folder} are one layer and must not import each other`);
    }
  }
  return problems;
}

test('no source file imports from a folder above its own layer', (t) => {
  const files = SOURCE_ROOTS.flatMap(sourceFiles);
  t.true(files.length > 50, `found only ${files.length} source files under ${SOURCE_ROOTS.join(', ')}`);
  t.deepEqual(
    layerViolations(files, (f) => fs.readFileSync(path.join(REPO, f), 'utf8')),
    [],
  );
});

/** One line per circle, naming its files, for the failure message. */
function describeCircles(circles: readonly string[][]): string[] {
  return circles.map(
    (files) => `${files.length === 1 ? 'imports itself' : `${files.length} files import each other`}: ${files.join(' <-> ')}`,
  );
}

test('within a folder with rooms, no file imports from a room above its own or beside it', (t) => {
  const files = SOURCE_ROOTS.flatMap(sourceFiles);
  t.deepEqual(
    roomViolations(files, (f) => fs.readFileSync(path.join(REPO, f), 'utf8')),
    [],
  );
});

test('the room check refuses an import up, an import sideways and a file in no room', (t) => {
  const sources: Record<string, string> = {
    'src/server/identity/a.ts': "import { r } from '../routing/r.js';",
    'src/server/routing/r.ts': "import { d } from '../destinations/d.js';\nimport { a } from '../identity/a.js';",
    'src/server/destinations/d.ts': '',
    'src/server/attic/x.ts': '',
    'src/server/server.ts': "import { r } from './routing/r.js';",
  };
  t.deepEqual(
    roomViolations(Object.keys(sources), (f) => sources[f]),
    [
      'src/server/identity/a.ts imports ../routing/r.js: room identity is below room routing of src/server',
      'src/server/routing/r.ts imports ../destinations/d.js: rooms routing and destinations of src/server are one level and must not import each other',
      'src/server/attic/x.ts: room attic of src/server is not placed; add it to ROOMS (test/packaging/layering.test.ts)',
    ],
  );
});

test('no import circle between source files', (t) => {
  const files = SOURCE_ROOTS.flatMap(sourceFiles);
  const graph = importGraph(files, (f) => fs.readFileSync(path.join(REPO, f), 'utf8'));
  const edges = [...graph.values()].reduce((n, to) => n + to.length, 0);
  t.true(edges > files.length, `only ${edges} imports among ${files.length} files: is the graph read at all?`);
  t.deepEqual(describeCircles(importCircles(graph)), []);
});

test('the circle finder finds direct, long, self and nested circles and nothing in a tree', (t) => {
  const graph = new Map<string, string[]>([
    // a <-> b directly; c -> d -> e -> c around; f imports itself; g, h, i form no circle (a diamond).
    ['a.ts', ['b.ts', 'g.ts']],
    ['b.ts', ['a.ts']],
    ['c.ts', ['d.ts']],
    ['d.ts', ['e.ts', 'g.ts']],
    ['e.ts', ['c.ts']],
    ['f.ts', ['f.ts']],
    ['g.ts', ['h.ts', 'i.ts']],
    ['h.ts', ['i.ts']],
    ['i.ts', []],
    // Two loops through j make one circle.
    ['j.ts', ['k.ts', 'l.ts']],
    ['k.ts', ['j.ts']],
    ['l.ts', ['j.ts']],
  ]);
  t.deepEqual(importCircles(graph), [['a.ts', 'b.ts'], ['c.ts', 'd.ts', 'e.ts'], ['f.ts'], ['j.ts', 'k.ts', 'l.ts']]);
  t.deepEqual(
    importCircles(
      new Map([
        ['g.ts', ['h.ts', 'i.ts']],
        ['h.ts', ['i.ts']],
        ['i.ts', []],
      ]),
    ),
    [],
  );
  t.deepEqual(describeCircles([['a.ts', 'b.ts'], ['f.ts']]), ['2 files import each other: a.ts <-> b.ts', 'imports itself: f.ts']);
});

test('the import graph resolves relative specifiers of every form to files, and leaves packages out', (t) => {
  const sources: Record<string, string> = {
    'src/server/a.ts': "import type { B } from './b.js';\nexport { c } from '../common/c.js';\nimport pino from 'pino';",
    'src/server/b.ts': "const a = await import('./a.js');\nimport {\n  d,\n} from './sub/index.js';",
    'src/common/c.ts': "import { gone } from './missing.js';",
    'src/server/sub/index.ts': '',
  };
  const graph = importGraph(Object.keys(sources), (f) => sources[f]);
  t.deepEqual(Object.fromEntries(graph), {
    'src/server/a.ts': ['src/server/b.ts', 'src/common/c.ts'],
    'src/server/b.ts': ['src/server/a.ts', 'src/server/sub/index.ts'],
    'src/common/c.ts': [],
    'src/server/sub/index.ts': [],
  });
  t.deepEqual(importCircles(graph), [['src/server/a.ts', 'src/server/b.ts']]);
});

test('runtime dependencies are exactly the packages the shipped code imports', (t) => {
  const imported = new Set<string>();
  for (const file of PRODUCT_ROOTS.flatMap(sourceFiles)) {
    for (const match of fs.readFileSync(path.join(REPO, file), 'utf8').matchAll(IMPORT)) {
      const spec = match[1];
      if (spec.startsWith('.') || spec.startsWith('node:')) continue;
      // "@scope/name/sub" -> "@scope/name", "name/sub" -> "name"
      imported.add(
        spec
          .split('/')
          .slice(0, spec.startsWith('@') ? 2 : 1)
          .join('/'),
      );
    }
  }
  const pkg = JSON.parse(fs.readFileSync(path.join(REPO, 'package.json'), 'utf8')) as { dependencies: Record<string, string> };
  t.deepEqual(Object.keys(pkg.dependencies).sort(), [...imported].sort());
});

test('the check sees imports up, sideways, dynamic and multi-line, and folders in no layer', (t) => {
  const sources: Record<string, string> = {
    'src/common/a.ts': "import { x } from '../tunnel/b.js';\nimport {\n  y,\n} from '../wire/c.js';",
    'src/server/d.ts': "export { z } from '../agent/e.js';\nconst m = await import('../cli/f.js');",
    'src/tunnel/g.ts': "import type { T } from './h.js';\nimport '../common/i.js';",
    'src/elsewhere/j.ts': "import { k } from '../wire/l.js';",
  };
  t.deepEqual(
    layerViolations(Object.keys(sources), (f) => sources[f]),
    [
      'src/common/a.ts imports ../tunnel/b.js: src/common is below src/tunnel',
      'src/server/d.ts imports ../agent/e.js: src/server and src/agent are one layer and must not import each other',
      'src/server/d.ts imports ../cli/f.js: src/server is below src/cli',
      'src/elsewhere/j.ts: its folder is in no layer; place it in LAYERS (test/packaging/layering.test.ts)',
    ],
  );
});
