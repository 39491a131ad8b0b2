/**
 * The Kubernetes API client library (@kubernetes/client-node) is a large
 * module graph: `kanal server` and `kanal agent` load it only when token
 * authentication or lease counting asks for a client (src/kube/kube-clients.ts),
 * so a process under a low open-files limit without those flags never opens
 * its files. Likewise @grpc/grpc-js loads only when --transport grpc-js asks
 * for it (src/cli/transport-choice.ts): on the default h2 it cost start-up RSS
 * for nothing (#15). Checked on the static import graph of the CLI's entry point.
 */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import test from 'ava';

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const KUBE_CLIENT = '@kubernetes/client-node';
const GRPC_JS = '@grpc/grpc-js';
const LIBRARIES = [KUBE_CLIENT, GRPC_JS];

function isLibrary(spec: string, library: string): boolean {
  return spec === library || spec.startsWith(`${library}/`);
}

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
        if (LIBRARIES.some((l) => isLibrary(spec, l))) reached.set(spec, via);
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

function staticLoads(library: string): string[] {
  const graph = staticGraph('src/cli/main.ts');
  if (!graph.has('src/cli/agent-command.ts') || !graph.has('src/cli/server-command.ts')) throw new Error('the walk does not reach both commands');
  return [...graph].filter(([file]) => isLibrary(file, library)).map(([, via]) => via.join(' -> '));
}

test('the CLI loads the Kubernetes client library only on use', (t) => {
  t.deepEqual(staticLoads(KUBE_CLIENT), [], 'import it with import() where a client is made (src/kube/kube-clients.ts)');
});

test('the CLI loads @grpc/grpc-js only when --transport grpc-js chooses it', (t) => {
  t.deepEqual(staticLoads(GRPC_JS), [], 'import the transport with import() where it is chosen (src/cli/transport-choice.ts)');
});
