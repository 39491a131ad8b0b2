/**
 * A log line whose fields its caller writes as JSON itself, for a line written
 * once per tunnelled connection (audit/connection-auditor.ts): the bytes pino
 * would write for the same fields (level, time, child bindings, the fields,
 * then the message), without pino's generic path, which runs the field bound
 * (log-safety.ts, BOUNDED_LOG_FIELDS) and a stringifier per field of a fresh
 * object. The caller bounds each string as that censor would (`logString`).
 * Reads the logger through `pino.symbols`, pino's documented extension point
 * (pino docs/api.md, "pino.symbols"); a logger this does not cover as pino
 * would (a mixin, hooks, a log formatter, a nested key, a message prefix, a
 * stream that wants metadata) gets no FixedLogLine: its caller logs as usual.
 */
import { pino, type Logger } from 'pino';
import { truncateForLog } from './log-safety.js';

const S = pino.symbols;

/**
 * `Date.now()` as RFC 3339 UTC, toISOString()'s text: formatted once per
 * second (toISOString costs about 2 µs), the milliseconds written on, and
 * the whole kept per millisecond (lines of one burst share it).
 */
let isoSecond = -1;
let isoSecondText = '';
let isoMs = -1;
let isoText = '';
export function isoNow(): string {
  const now = Date.now();
  if (now === isoMs) return isoText;
  const second = Math.floor(now / 1000);
  if (second !== isoSecond) {
    isoSecond = second;
    // "YYYY-MM-DDTHH:MM:SS." (Date.now() is always within toISOString's four-digit years).
    isoSecondText = new Date(second * 1000).toISOString().slice(0, 20);
  }
  const ms = now - second * 1000;
  isoMs = now;
  isoText = `${isoSecondText}${ms < 10 ? '00' : ms < 100 ? '0' : ''}${ms}Z`;
  return isoText;
}

/** `,"key":"value"` with the value bounded as the logger bounds a field; `key` must need no escaping. */
export function logString(key: string, value: string | undefined): string {
  return value === undefined ? '' : `,"${key}":${JSON.stringify(truncateForLog(value))}`;
}

/** `,"key":n`, as pino writes a number (a non-finite one as null). */
export function logNumber(key: string, value: number): string {
  return `,"${key}":${Number.isFinite(value) ? String(value) : 'null'}`;
}

interface PinoStream {
  write(line: string): void;
}

function isStream(v: unknown): v is PinoStream {
  return typeof v === 'object' && v !== null && typeof Reflect.get(v, 'write') === 'function';
}

export class FixedLogLine {
  private constructor(
    private readonly log: Logger,
    private readonly stream: PinoStream,
    /** `{"level":...` up to the time: pino's cached prefix of the level. */
    private readonly levelPrefix: string,
    /** pino's `timestamp` function; undefined: it is isoTime, written from isoNow(). */
    private readonly time: (() => string) | undefined,
    /** The message field and the line's end, which never change. */
    private readonly tail: string,
  ) {}

  /**
   * A writer of `msg` lines at info for `log`, or undefined where only pino's
   * own path writes what pino would. `msg`: a constant of ours, shorter than
   * the bound on messages.
   */
  static info(log: Logger, msg: string): FixedLogLine | undefined {
    const stream: unknown = Reflect.get(log, S.streamSym);
    const hooks: unknown = Reflect.get(log, S.hooksSym);
    const formatters: unknown = Reflect.get(log, S.formattersSym);
    const lsCache: unknown = Reflect.get(log, S.lsCacheSym);
    const time: unknown = Reflect.get(log, S.timeSym);
    const messageKey: unknown = Reflect.get(log, S.messageKeySym);
    const end: unknown = Reflect.get(log, S.endSym);
    const level = log.levels.values.info;
    const prefix: unknown = typeof lsCache === 'object' && lsCache !== null ? Reflect.get(lsCache, level) : undefined;
    if (
      !isStream(stream) ||
      Reflect.get(stream, S.needsMetadataGsym) === true ||
      Reflect.get(log, S.mixinSym) ||
      Reflect.get(log, S.nestedKeySym) ||
      log.msgPrefix ||
      (typeof hooks === 'object' && hooks !== null && Reflect.get(hooks, 'streamWrite')) ||
      (typeof formatters === 'object' && formatters !== null && Reflect.get(formatters, 'log')) ||
      typeof prefix !== 'string' ||
      typeof time !== 'function' ||
      typeof messageKey !== 'string' ||
      typeof end !== 'string'
    )
      return undefined;
    const timeFn = time === pino.stdTimeFunctions.isoTime ? undefined : () => String(Reflect.apply(time, log, []));
    return new FixedLogLine(log, stream, prefix, timeFn, `,${JSON.stringify(messageKey)}:${JSON.stringify(msg)}${end}`);
  }

  /** Writes one line of `fields` (`,"key":value` each, in order); `iso`: isoNow() of the caller, the line's time. */
  write(fields: string, iso: string): void {
    const time = this.time ? this.time() : `,"time":"${iso}"`;
    const chindings: unknown = Reflect.get(this.log, S.chindingsSym);
    this.stream.write(`${this.levelPrefix}${time}${typeof chindings === 'string' ? chindings : ''}${fields}${this.tail}`);
  }
}
