/** Starting the real `kanal` CLI as child processes and waiting for readiness. */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';

export const CLI = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../src/cli/main.js');

export interface Child {
  proc: ChildProcess;
  logFile: string;
  stop(signal?: NodeJS.Signals): Promise<number | null>;
}

/**
 * Runs `kanal args` with output appended to logFile. `wrapper` (e.g. prlimit
 * and its arguments) runs it; `umask` is set by a shell that then execs it.
 */
export function startKanal(args: string[], logFile: string, opts: { wrapper?: string[]; umask?: number } = {}): Child {
  const out = fs.openSync(logFile, 'a');
  const command = [...(opts.wrapper ?? []), process.execPath, CLI, ...args];
  const proc =
    opts.umask === undefined
      ? spawn(command[0]!, command.slice(1), { stdio: ['ignore', out, out] })
      : spawn('/bin/sh', ['-c', `umask ${opts.umask.toString(8).padStart(4, '0')} && exec "$0" "$@"`, ...command], { stdio: ['ignore', out, out] });
  fs.closeSync(out);
  const exited = new Promise<number | null>((resolve) => proc.once('exit', (code) => resolve(code)));
  return {
    proc,
    logFile,
    async stop(signal: NodeJS.Signals = 'SIGTERM') {
      if (proc.exitCode !== null || proc.signalCode !== null) return proc.exitCode;
      proc.kill(signal);
      const timer = setTimeout(() => proc.kill('SIGKILL'), 10_000);
      const code = await exited;
      clearTimeout(timer);
      return code;
    },
  };
}

export function freePort(host = '127.0.0.1'): Promise<number> {
  return new Promise<number>((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, host, () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(port));
    });
  });
}

function getStatus(url: string): Promise<number> {
  return new Promise<number>((resolve) => {
    const req = http.get(url, { timeout: 1000 }, (res) => {
      res.resume();
      resolve(res.statusCode ?? 0);
    });
    req.on('error', () => resolve(0));
    req.on('timeout', () => req.destroy());
  });
}

/** Polls a /readyz URL until it answers 200; throws after timeoutMs. */
export async function waitReady(url: string, timeoutMs: number, child?: Child): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (child && child.proc.exitCode !== null) throw new Error(`process exited with ${child.proc.exitCode}; see ${child.logFile}`);
    if ((await getStatus(url)) === 200) return;
    await sleep(100);
  }
  throw new Error(`${url} not ready after ${timeoutMs} ms`);
}
