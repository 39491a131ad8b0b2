/**
 * The young generation stays at V8's initial size (#15, docs/memory.md).
 *
 * V8 grows its semi-spaces (up to 16 MiB each) as survivors of scavenges pile
 * up, as they do while the modules load and while tunnels and connections
 * are set up, and keeps those pages for good: it shrinks them only after a
 * mark-compact at a low allocation rate, which an idle proxy never runs. A
 * proxy allocates little JavaScript per byte it moves (gc-pacer.ts collects
 * its buffers every 8 MiB anyway): a small young generation saves ~20 MiB per
 * process for more frequent, cheap scavenges (a few µs per dial). V8
 * reads the growth factor at each growth decision (Heap::ExpandNewSpaceSize),
 * so setting it before the commands load keeps the initial size.
 * KANAL_SMALL_YOUNG_GENERATION=0 leaves V8's default.
 */
import v8 from 'node:v8';

export function keepYoungGenerationSmall(): void {
  if (process.env.KANAL_SMALL_YOUNG_GENERATION === '0') return;
  v8.setFlagsFromString('--semi-space-growth-factor=1');
}
