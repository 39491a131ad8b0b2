/**
 * The Kubernetes API client library (@kubernetes/client-node) is a large
 * module graph: `kanal server` and `kanal agent` load it only when token
 * authentication or lease counting asks for a client (src/kube/kube-clients.ts),
 * so a process under a low open-files limit without those flags never opens
 * its files. Likewise @grpc/grpc-js loads only when --transport grpc-js asks
 * for it (src/transport/choice.ts): on the default h2 it cost start-up RSS
 * for nothing. Checked on the static import graphs of the CLI's entry
 * point and of each command's module.
 */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import test from 'ava';

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const KUBE_CLIENT = '@kubernetes/client-node';
const GRPC_JS = '@grpc/grpc-js';
const LIBRARIES = [KUBE_CLIENT, GRPC_JS];

function isLibrary(spec: string, library: string): boolean {
  return spec === library || spec.startsWith(`${library}/`);
}

/** Specifiers of imports that load a module when this one loads (not `import type`, not `import()`). */
const STATIC_IMPORT = /^(?:import|export)\s+(?!type\b)(?:[^;'"]*?\sfrom\s+)?['"]([^'"\s]+)['"]/gm;

/** Every source file the entry points load statically, each with the path that reached it. */
function staticGraph(entries: string[]): Map<string, string[]> {
  const reached = new Map<string, string[]>(entries.map((e) => [e, [e]]));
  const queue = [...entries];
  for (let file = queue.shift(); file !== undefined; file = queue.shift()) {
    const text = fs.readFileSync(path.join(REPO, file), 'utf8');
    for (const m of text.matchAll(STATIC_IMPORT)) {
      const spec = m[1];
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

/** The entry point, and each command's module (main.ts imports the one it runs with import()). */
const CLI_ENTRIES = ['src/cli/main.ts', 'src/cli/server-command.ts', 'src/cli/agent-command.ts', 'src/cli/install-node-command.ts'];

function staticLoads(library: string): string[] {
  const graph = staticGraph(CLI_ENTRIES);
  if (!CLI_ENTRIES.every((e) => fs.existsSync(path.join(REPO, e))))
    throw new Error(`the CLI's entry points moved: ${CLI_ENTRIES.join(', ')}`);
  return [...graph].filter(([file]) => isLibrary(file, library)).map(([, via]) => via.join(' -> '));
}

test('the CLI loads the Kubernetes client library only on use', (t) => {
  t.deepEqual(staticLoads(KUBE_CLIENT), [], 'import it with import() where a client is made (src/kube/kube-clients.ts)');
});

test('the CLI loads @grpc/grpc-js only when --transport grpc-js chooses it', (t) => {
  t.deepEqual(staticLoads(GRPC_JS), [], 'import the transport with import() where it is chosen (src/transport/choice.ts)');
});

test("the CLI's entry point loads a command's modules only when that command runs", (t) => {
  const graph = staticGraph(['src/cli/main.ts']);
  const loaded = CLI_ENTRIES.slice(1)
    .filter((e) => graph.has(e))
    .map((e) => graph.get(e)!.join(' -> '));
  t.deepEqual(loaded, [], 'main.ts imports each command with import() once it knows which one runs');
});
