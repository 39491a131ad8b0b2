/** The few facts about the node's systemd that install-node needs. */
import fs from 'node:fs';
import { execFileSync } from 'node:child_process';

/** Major version from `systemctl --version` ("systemd 252 (252.38-1~deb12u1)"), or undefined. */
export function detectSystemdVersion(): number | undefined {
  try {
    const out = execFileSync('systemctl', ['--version'], { encoding: 'utf8', timeout: 5000, stdio: ['ignore', 'pipe', 'ignore'] });
    return parseSystemdVersion(out);
  } catch {
    return undefined;
  }
}

export function parseSystemdVersion(text: string): number | undefined {
  const m = /^systemd (\d+)/m.exec(text);
  return m ? Number(m[1]) : undefined;
}

/** True when systemd is PID 1 here (sd_booted(3)). */
export function systemdRunning(): boolean {
  return fs.existsSync('/run/systemd/system');
}

/** Runs systemctl; returns the error text instead of throwing. */
export function systemctl(args: string[]): string | undefined {
  try {
    execFileSync('systemctl', args, { encoding: 'utf8', timeout: 60_000, stdio: ['ignore', 'pipe', 'pipe'] });
    return undefined;
  } catch (err) {
    const e = err as Error & { stderr?: string };
    return (e.stderr || e.message).trim();
  }
}
