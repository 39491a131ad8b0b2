/**
 * V8 flags every form of Kanal runs with: the executable's `execArgv`, the
 * npm form's shebang (src/cli/main.ts) and the launchers of tests and
 * benchmarks (kit/launch). Heap sizes cannot be changed once V8's heap exists:
 * `v8.setFlagsFromString` at start is too late.
 *
 * `--max-semi-space-size=8`: V8 in Node 26 lets the young generation grow to
 * two 32 MiB semi-spaces (Node 20: 16 MiB), and a flood of short-lived objects
 * fills them: a grpc-js agent flooded with CLOSE_REQs peaked 88 MiB above its
 * start, 67 MiB with 16 MiB semi-spaces, 48-52 MiB with 8 (docs/memory.md, "Node 26").
 */
export const RUNTIME_FLAGS: readonly string[] = ['--max-semi-space-size=8'];
