/**
 * Cancellation for the dial path. An AbortController with its AbortSignal (an
 * EventTarget) costs about 12 µs per dial to create, listen on and drop; a
 * dial makes one on each side (bench/notes/dial-profile.md finding 4).
 * Cancel does the same job for a plain object's price.
 */

/** What the dial path needs of a cancellation signal; AbortSignal has it too, so either may be passed. */
export interface CancelSignal {
  readonly aborted: boolean;
  addEventListener(type: 'abort', listener: () => void, options?: { once?: boolean }): void;
  removeEventListener(type: 'abort', listener: () => void): void;
}

/** Both the controller and its signal: the owner calls abort(), the rest see it as a CancelSignal. */
export class Cancel implements CancelSignal {
  /** Set by the first abort(); never cleared. */
  aborted = false;
  /**
   * Listeners to call on abort, each once, in the order added (none twice,
   * as with EventTarget). Emptied by abort(); a listener added after abort()
   * is never called, one removed while abort() runs is not called either, as
   * with AbortSignal. Listeners must not throw.
   */
  private readonly listeners: (() => void)[] = [];

  abort(): void {
    if (this.aborted) return;
    this.aborted = true;
    for (let listener = this.listeners.shift(); listener; listener = this.listeners.shift()) listener();
  }

  addEventListener(_type: 'abort', listener: () => void): void {
    if (this.aborted || this.listeners.includes(listener)) return;
    this.listeners.push(listener);
  }

  removeEventListener(_type: 'abort', listener: () => void): void {
    const i = this.listeners.indexOf(listener);
    if (i >= 0) this.listeners.splice(i, 1);
  }
}
