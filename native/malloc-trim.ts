/**
 * glibc's malloc_trim(3): hands the free pages of every malloc arena back to
 * the kernel. glibc keeps freed memory for reuse and returns only a free tail
 * of the main heap on its own, so after a burst of connections (OpenSSL and
 * nghttp2 state, freed with each socket) the pages stay resident although
 * nothing uses them (docs/memory.md, "Connection churn").
 */
import koffi from 'koffi';

export type MallocTrim = () => void;

/** undefined: not looked up yet; null: this libc has no malloc_trim (musl) or koffi cannot load it. */
let trim: MallocTrim | null | undefined;

/** malloc_trim(0), or null where the C library has none. */
export function mallocTrim(): MallocTrim | null {
  if (trim !== undefined) return trim;
  try {
    const fn = koffi.load('libc.so.6').func('int malloc_trim(size_t)') as (pad: number) => number;
    trim = () => void fn(0);
  } catch {
    trim = null;
  }
  return trim;
}
