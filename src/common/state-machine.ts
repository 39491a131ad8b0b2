/**
 * The one idiom for an object with a lifecycle: a state type, the moves it
 * allows written once beside it, and one transition function that refuses any
 * other move (a bug in this process, never a peer's doing) and traces each
 * move for debug logs — as grpc-js's subchannel does with
 * `transitionToState(oldStates, newState)` (grpc-js src/subchannel.ts).
 *
 * A state is a name ('open') or an object with a `kind` and the data that
 * state alone has ({ kind: 'detached', since }).
 */

/** A state: its name, or an object named by its `kind`. */
export type State = string | { readonly kind: string };

/** The name of a state. */
export type KindOf<S extends State> = S extends string ? S : S extends { readonly kind: infer K } ? K & string : never;

/** From each state, the states it may move to (an empty list: a final state). */
export type Moves<S extends State> = Readonly<Record<KindOf<S>, readonly KindOf<S>[]>>;

/** What a kind of object declares once (a module constant): shared by all its instances. */
export interface Lifecycle<S extends State> {
  /** What the object is, for the error of a move it does not allow ("tunnel", "agent"). */
  readonly name: string;
  readonly moves: Moves<S>;
  /** A condition beyond the names, for a move between two states the moves allow (e.g. a drain, once begun, is kept). */
  readonly allows?: (from: S, to: S) => boolean;
  /** How a state reads in errors and traces; its kind by default. */
  readonly describe?: (s: S) => string;
}

/** Called on every move, after it: a debug log line. */
export type MoveTrace<S extends State> = (from: S, to: S) => void;

export function kindOf<S extends State>(s: S): KindOf<S> {
  return (typeof s === 'string' ? s : s.kind) as KindOf<S>;
}

/** How `s` reads in errors and traces: as its lifecycle describes it, else its kind. */
export function describeState<S extends State>(lifecycle: Lifecycle<S>, s: S): string {
  return lifecycle.describe?.(s) ?? kindOf(s);
}

/** What a debug trace writes to: a pino logger, or anything with its `debug(fields, message)`. */
export interface DebugLog {
  debug(fields: object, message: string): void;
}

/**
 * A trace that logs each move at debug level ("tunnel: open -> detached"),
 * with `fields` (the object's identity) on the line; undefined when `enabled`
 * is false, so an object whose moves are not logged holds no closure.
 */
export function debugTrace<S extends State>(
  lifecycle: Lifecycle<S>,
  log: DebugLog,
  fields: object = {},
  enabled = true,
): MoveTrace<S> | undefined {
  if (!enabled) return undefined;
  return (from, to) => log.debug(fields, `${lifecycle.name}: ${describeState(lifecycle, from)} -> ${describeState(lifecycle, to)}`);
}

export class StateMachine<S extends State> {
  private value: S;

  constructor(
    initial: S,
    private readonly lifecycle: Lifecycle<S>,
    private readonly trace?: MoveTrace<S>,
  ) {
    this.value = initial;
  }

  get state(): S {
    return this.value;
  }

  get kind(): KindOf<S> {
    return kindOf(this.value);
  }

  is(...kinds: readonly KindOf<S>[]): boolean {
    return kinds.includes(kindOf(this.value));
  }

  /** Whether the move to `next` is allowed from here. */
  canMove(next: S): boolean {
    const { moves, allows } = this.lifecycle;
    return moves[kindOf(this.value)].includes(kindOf(next)) && (allows?.(this.value, next) ?? true);
  }

  /** Moves to `next`; a move the lifecycle does not allow throws. */
  to(next: S): void {
    if (!this.canMove(next))
      throw new Error(`${this.lifecycle.name}: no transition from ${this.describe(this.value)} to ${this.describe(next)}`);
    this.move(next);
  }

  /** Moves to `next` where the lifecycle allows it, else stays (a late event, ignored); says whether it moved. */
  toIfAllowed(next: S): boolean {
    if (!this.canMove(next)) return false;
    this.move(next);
    return true;
  }

  /** Moves to `next` only from one of `from` (and where allowed); says whether it moved. */
  from(from: readonly KindOf<S>[], next: S): boolean {
    if (!from.includes(kindOf(this.value)) || !this.canMove(next)) return false;
    this.move(next);
    return true;
  }

  private move(next: S): void {
    const previous = this.value;
    this.value = next;
    this.trace?.(previous, next);
  }

  private describe(s: S): string {
    return describeState(this.lifecycle, s);
  }
}
