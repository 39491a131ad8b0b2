// Shared by the test/packaging/ files: the repository layout, running the CLI
// (kit/launch/), reading unit and env files the way systemd does, and a
// datagram listener standing in for systemd's NOTIFY_SOCKET.

import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createInterface } from 'node:readline';
import { Child } from '../../kit/launch/child.js';
import { CleanupStack, scopedTempDir } from '../../kit/launch/cleanup-scope.js';
import { kanalCommand } from '../../kit/launch/kanal-cli.js';
import { waitUntilLogged } from '../../kit/launch/log-reader.js';
import type { RunResult } from '../../kit/launch/run-to-end.js';

/** Repository root (dist/test/helpers/ -> ../../..). */
export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
export { KANAL_CLI as CLI, runKanal as kanal } from '../../kit/launch/kanal-cli.js';
export { run, type RunOptions, type RunResult } from '../../kit/launch/run-to-end.js';

/**
 * Why a `--dry-run` refused the command line, or undefined when it accepted
 * it: exit 0, or exit 1 only because credential files it names do not exist
 * here (the shipped examples name /etc/kanal/...; --dry-run checks them).
 */
export function dryRunRefusal(r: RunResult): string | undefined {
  if (r.code === 0) return undefined;
  const problems = r.stderr
    .trim()
    .split('\n')
    .map((l) => l.replace(/^kanal: /, '').trim())
    .filter((l) => !/^\d+ problems with credential files:$/.test(l));
  const missingOnly = problems.length > 0 && problems.every((l) => /^--[a-z-]+ \/\S+: cannot read \(ENOENT: no such file\)$/.test(l));
  return r.code === 1 && missingOnly ? undefined : `exit ${r.code}: ${r.stderr}`;
}

export async function tempDir(prefix: string): Promise<{ dir: string; remove: () => Promise<void> }> {
  const dir = await mkdtemp(path.join(os.tmpdir(), prefix));
  return { dir, remove: () => rm(dir, { recursive: true, force: true }) };
}

// ---------------------------------------------------------------- systemd syntax

export interface UnitFile {
  /** section -> key -> values in order (keys may repeat). */
  sections: Map<string, Map<string, string[]>>;
}

/** Parses a unit file or drop-in (comments, sections, repeated keys, backslash continuation). */
export function parseUnit(text: string): UnitFile {
  const sections = new Map<string, Map<string, string[]>>();
  let current: Map<string, string[]> | undefined;
  const lines = text.replace(/\\\n/g, ' ').split('\n');
  for (const raw of lines) {
    const line = raw.trim();
    if (line === '' || line.startsWith('#') || line.startsWith(';')) continue;
    const section = /^\[(.+)\]$/.exec(line);
    if (section) {
      current = sections.get(section[1]) ?? new Map<string, string[]>();
      sections.set(section[1], current);
      continue;
    }
    const eq = line.indexOf('=');
    if (eq <= 0 || !current) throw new Error(`unit syntax: ${JSON.stringify(line)}`);
    const key = line.slice(0, eq).trim();
    const list = current.get(key) ?? [];
    list.push(line.slice(eq + 1).trim());
    current.set(key, list);
  }
  return { sections };
}

export function unitValue(unit: UnitFile, section: string, key: string): string | undefined {
  const values = unit.sections.get(section)?.get(key);
  return values?.[values.length - 1];
}

/** Splits a command line into words the way systemd does (double and single quotes). */
export function splitWords(text: string): string[] {
  const words: string[] = [];
  const re = /"((?:[^"\\]|\\.)*)"|'([^']*)'|(\S+)/g;
  for (const m of text.matchAll(re)) words.push(m[1] !== undefined ? m[1].replace(/\\(.)/g, '$1') : (m[2] ?? m[3]));
  return words;
}

/** Parses an EnvironmentFile= (KEY=value, KEY="value", comments). */
export function parseEnvFile(text: string): Map<string, string> {
  const env = new Map<string, string>();
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (line === '' || line.startsWith('#') || line.startsWith(';')) continue;
    const m = /^([A-Za-z_][A-Za-z0-9_]*)=(.*)$/.exec(line);
    if (!m) throw new Error(`environment file syntax: ${JSON.stringify(line)}`);
    let value = m[2];
    const quoted = /^"((?:[^"\\]|\\.)*)"$/.exec(value) ?? /^'([^']*)'$/.exec(value);
    if (quoted) value = quoted[1].replace(/\\(.)/g, '$1');
    else if (/["'\\]/.test(value)) throw new Error(`environment file: ambiguous quoting in ${JSON.stringify(line)}`);
    env.set(m[1], value);
  }
  return env;
}

/**
 * ExecStart= words after systemd's variable expansion: "$VAR" alone as a word
 * becomes several words (split at whitespace), "${VAR}" one word.
 */
export function expandExecStart(execStart: string, env: ReadonlyMap<string, string>): string[] {
  const line = execStart.replace(/^[-@:+!]+/, '');
  const out: string[] = [];
  for (const word of splitWords(line)) {
    const split = /^\$([A-Za-z_][A-Za-z0-9_]*)$/.exec(word);
    if (split) {
      const value = env.get(split[1]);
      if (value === undefined) throw new Error(`ExecStart uses $${split[1]} but no environment file defines it`);
      out.push(...value.split(/\s+/).filter((w) => w !== ''));
      continue;
    }
    out.push(
      word.replace(/\$\{([A-Za-z_][A-Za-z0-9_]*)\}/g, (_m, name: string) => {
        const value = env.get(name);
        if (value === undefined) throw new Error(`ExecStart uses \${${name}} but no environment file defines it`);
        return value;
      }),
    );
  }
  return out;
}

/** Go-style duration or systemd time span ("45s", "1min 30s" is not used here) in seconds. */
export function seconds(text: string): number {
  const m = /^(\d+)(ms|s|m|min|h)?$/.exec(text.trim());
  if (!m) throw new Error(`cannot read duration ${JSON.stringify(text)}`);
  const n = Number(m[1]);
  switch (m[2]) {
    case 'ms':
      return n / 1000;
    case 'm':
    case 'min':
      return n * 60;
    case 'h':
      return n * 3600;
    default:
      return n;
  }
}

// ---------------------------------------------------------------- NOTIFY_SOCKET

const LISTENER = `
import json, os, socket, sys
addr = sys.argv[1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind('\\0' + addr[1:] if addr.startswith('@') else addr)
if not addr.startswith('@'):
    os.chmod(addr, 0o777)
print('bound', flush=True)
while True:
    data, _ = s.recvfrom(65536)
    print(json.dumps(data.decode('utf-8', 'replace')), flush=True)
`;

/**
 * An AF_UNIX datagram socket like systemd's notification socket, implemented
 * independently of native/sd-notify.ts (Python's socket module).
 */
export class NotifyListener {
  readonly messages: string[] = [];
  private readonly waiters = new Set<() => void>();

  private constructor(
    readonly address: string,
    private readonly child: ChildProcess,
  ) {}

  static async start(address: string): Promise<NotifyListener> {
    const child = spawn('python3', ['-c', LISTENER, address], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stderr = '';
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    const listener = new NotifyListener(address, child);
    const lines = createInterface({ input: child.stdout });
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`notify listener did not bind ${address}: ${stderr}`)), 60_000);
      child.once('exit', (code) => {
        clearTimeout(timer);
        reject(new Error(`notify listener exited (${code}): ${stderr}`));
      });
      lines.on('line', (line) => {
        if (line === 'bound') {
          clearTimeout(timer);
          resolve();
          return;
        }
        listener.messages.push(JSON.parse(line) as string);
        for (const wake of [...listener.waiters]) wake();
      });
    });
    return listener;
  }

  /** Resolves with the first message matching, waiting up to timeoutMs. */
  waitFor(match: (message: string) => boolean, timeoutMs = 60_000): Promise<string> {
    return new Promise((resolve, reject) => {
      const check = (): boolean => {
        const found = this.messages.find(match);
        if (found === undefined) return false;
        this.waiters.delete(wake);
        clearTimeout(timer);
        resolve(found);
        return true;
      };
      const wake = (): void => void check();
      const timer = setTimeout(() => {
        this.waiters.delete(wake);
        reject(new Error(`no matching notification within ${timeoutMs} ms; got ${JSON.stringify(this.messages)}`));
      }, timeoutMs);
      this.waiters.add(wake);
      check();
    });
  }

  close(): void {
    if (this.child.exitCode === null && this.child.pid !== undefined) process.kill(this.child.pid, 'SIGKILL');
  }
}

// ---------------------------------------------------------------- real processes

/** The output of a started command, line by line, with a bounded wait for one. */
export interface OutputLines {
  readonly lines: string[];
  /** Fails after timeoutMs, or as soon as the process ends without such a line. */
  waitFor(match: (line: string) => boolean, timeoutMs?: number): Promise<string>;
}

export interface Started {
  child: Child;
  out: OutputLines;
  /** Everything it wrote (stdout and stderr), for failure messages. */
  output: () => string;
  /** SIGTERM, then SIGKILL after graceMs; resolves with the exit code. */
  stop: (graceMs?: number) => Promise<number | null>;
}

/** Log directories of started commands: removed when the test process exits (kit/launch/exit-cleanup.ts). */
const logDirs = new CleanupStack();

/** Starts `kanal <args>` in the background (optionally under a wrapper like `ip netns exec`); the caller stops it. */
export function startKanal(args: readonly string[], opts: { env?: NodeJS.ProcessEnv; wrapper?: readonly string[] } = {}): Started {
  const logFile = path.join(scopedTempDir(logDirs, 'kanal-packaging-'), 'output.log');
  const child = new Child({
    name: `kanal ${args[0] ?? ''}`.trim(),
    argv: [...kanalCommand(), ...args],
    logFile,
    wrapper: opts.wrapper,
    env: opts.env,
  });
  const lines = (): string[] =>
    child
      .log()
      .split('\n')
      .filter((l) => l !== '');
  return {
    child,
    out: {
      get lines() {
        return lines();
      },
      waitFor: (match, timeoutMs = 60_000) =>
        waitUntilLogged({
          file: logFile,
          find: (text) => text.split('\n').find((l) => l !== '' && match(l)),
          timeoutMs,
          what: `${child.name}: a matching line`,
          ended: () => child.ended(),
        }),
    },
    output: () => child.log(),
    stop: (graceMs = 10_000) => child.stop('SIGTERM', graceMs),
  };
}

/** The JSON field `key` of the first log line whose msg is `msg`. */
export async function logField(out: OutputLines, msg: string, key: string, timeoutMs = 60_000): Promise<string> {
  const line = await out.waitFor((l) => l.includes(`"msg":"${msg}"`), timeoutMs);
  const value = (JSON.parse(line) as Record<string, unknown>)[key];
  return String(value);
}

/** Port number at the end of "host:port". */
export function portOf(address: string): number {
  return Number(address.slice(address.lastIndexOf(':') + 1));
}
