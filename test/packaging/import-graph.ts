/**
 * The import graph of the repository's source files, and its circles. A
 * circle (files that import each other, directly or around a loop) means two
 * concepts that cannot be understood, tested or loaded one without the other;
 * ES modules also see a partly initialised module at run time inside one.
 * Circles are the strongly connected components of more than one file (or a
 * file importing itself), found with Tarjan's algorithm (R. Tarjan, "Depth-first
 * search and linear graph algorithms", SIAM J. Comput. 1(2), 1972).
 */
import path from 'node:path';

/** Module specifiers of static imports, re-exports and dynamic imports (`import type` included). */
export const IMPORT = /(?:\bfrom\s+|\bimport\s*\(\s*|\bimport\s+)['"]([^'"\s]+)['"]/g;

/** File -> the files it imports, as repository paths. */
export type ImportGraph = ReadonlyMap<string, readonly string[]>;

/** The file a relative specifier of `from` names, if it is one of `files` (`./x.js` is `./x.ts` compiled). */
function resolve(from: string, spec: string, files: ReadonlySet<string>): string | undefined {
  const target = path.posix.normalize(path.posix.join(path.posix.dirname(from), spec));
  const candidates = [target.replace(/\.js$/, '.ts'), target, `${target}.ts`, `${target}/index.ts`];
  return candidates.find((c) => files.has(c));
}

/** The graph of relative imports among `files`; imports of packages and of files outside `files` are left out. */
export function importGraph(files: readonly string[], read: (file: string) => string): Map<string, string[]> {
  const known = new Set(files);
  const graph = new Map<string, string[]>();
  for (const file of files) {
    const targets = new Set<string>();
    for (const match of read(file).matchAll(IMPORT)) {
      const spec = match[1];
      if (!spec.startsWith('.')) continue;
      const target = resolve(file, spec, known);
      if (target) targets.add(target);
    }
    graph.set(file, [...targets]);
  }
  return graph;
}

/** Every circle of `graph`: its files sorted, the circles sorted by their first file. */
export function importCircles(graph: ImportGraph): string[][] {
  const index = new Map<string, number>();
  const lowlink = new Map<string, number>();
  const onStack = new Set<string>();
  const stack: string[] = [];
  const circles: string[][] = [];
  let next = 0;

  const visit = (file: string): void => {
    index.set(file, next);
    lowlink.set(file, next);
    next++;
    stack.push(file);
    onStack.add(file);
    for (const to of graph.get(file) ?? []) {
      if (!index.has(to)) {
        visit(to);
        lowlink.set(file, Math.min(lowlink.get(file)!, lowlink.get(to)!));
      } else if (onStack.has(to)) {
        lowlink.set(file, Math.min(lowlink.get(file)!, index.get(to)!));
      }
    }
    if (lowlink.get(file) !== index.get(file)) return;
    const component: string[] = [];
    let member: string;
    do {
      member = stack.pop()!;
      onStack.delete(member);
      component.push(member);
    } while (member !== file);
    if (component.length > 1 || (graph.get(file) ?? []).includes(file)) circles.push(component.sort());
  };

  for (const file of graph.keys()) if (!index.has(file)) visit(file);
  return circles.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
}
