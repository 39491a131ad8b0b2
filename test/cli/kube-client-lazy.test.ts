/**
 * The Kubernetes API client library (@kubernetes/client-node) is a large
 * module graph: `kanal server` and `kanal agent` load it only when token
 * authentication or lease counting asks for a client (src/kube/kube-clients.ts),
 * so a process under a low open-files limit without those flags never opens
 * its files. Checked on the static import graph of the CLI's entry point.
 */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import test from 'ava';

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const LIBRARY = '@kubernetes/client-node';

/** Specifiers of imports that load a module when this one loads (not `import type`, not `import()`). */
const STATIC_IMPORT = /^(?:import|export)\s+(?!type\b)(?:[^;'"]*?\sfrom\s+)?['"]([^'"\s]+)['"]/gm;

/** Every source file the entry point loads statically, each with the path that reached it. */
function staticGraph(entry: string): Map<string, string[]> {
  const reached = new Map<string, string[]>([[entry, [entry]]]);
  const queue = [entry];
  for (let file = queue.shift(); file !== undefined; file = queue.shift()) {
    const text = fs.readFileSync(path.join(REPO, file), 'utf8');
    for (const m of text.matchAll(STATIC_IMPORT)) {
      const spec = m[1]!;
      const via = [...reached.get(file)!, spec];
      if (!spec.startsWith('.')) {
        if (spec === LIBRARY || spec.startsWith(`${LIBRARY}/`)) reached.set(spec, via);
        continue;
      }
      const target = path.posix.join(path.posix.dirname(file), spec).replace(/\.js$/, '.ts');
      if (reached.has(target) || !fs.existsSync(path.join(REPO, target))) continue;
      reached.set(target, via);
      queue.push(target);
    }
  }
  return reached;
}

test('the CLI loads the Kubernetes client library only on use', (t) => {
  const graph = staticGraph('src/cli/main.ts');
  t.true(graph.has('src/cli/agent-command.ts') && graph.has('src/cli/server-command.ts'), 'the walk reaches both commands');
  const loads = [...graph].filter(([file]) => file.startsWith(LIBRARY)).map(([, via]) => via.join(' -> '));
  t.deepEqual(loads, [], 'import it with import() where a client is made (src/kube/kube-clients.ts)');
});
