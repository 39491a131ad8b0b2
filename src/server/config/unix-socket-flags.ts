/** `--uds-mode` and `--uds-group`: the frontend socket's permission bits and group (see unix-socket.ts). */
import fs from 'node:fs';
import { UsageError } from '../../common/usage-error.js';
import { errorMessage } from '../../common/error-message.js';

/** Octal permission bits, "0660" or "660"; no setuid/setgid/sticky bits (meaningless on a socket). */
export function fileModeFlag(flag: string, text: string): number {
  if (!/^0?[0-7]{3}$/.test(text))
    throw new UsageError(`--${flag} must be octal permission bits such as 0660 or 0600, got ${JSON.stringify(text)}`);
  const mode = parseInt(text, 8);
  if ((mode & 0o200) === 0)
    throw new UsageError(`--${flag} ${text} leaves the owner without write permission; connecting to a Unix socket needs it`);
  return mode;
}

/**
 * A numeric gid, or a group name looked up in /etc/group (`groupFile`).
 * Groups only a directory service knows need their number.
 */
export function groupFlag(flag: string, text: string, groupFile = '/etc/group'): number {
  if (/^\d+$/.test(text)) {
    const gid = Number(text);
    if (gid > 0xfffffffe) throw new UsageError(`--${flag} ${text} is not a valid group ID`);
    return gid;
  }
  let lines: string[];
  try {
    lines = fs.readFileSync(groupFile, 'utf8').split('\n');
  } catch (err) {
    throw new UsageError(
      `--${flag} ${JSON.stringify(text)}: cannot read ${groupFile} to look the group up (${errorMessage(err)}); pass the numeric group ID`,
    );
  }
  for (const line of lines) {
    const [name, , gid] = line.split(':');
    if (name === text && gid !== undefined && /^\d+$/.test(gid)) return Number(gid);
  }
  throw new UsageError(`--${flag}: no group ${JSON.stringify(text)} in ${groupFile}; pass an existing group or its numeric ID`);
}
