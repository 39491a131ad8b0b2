// The owner lock: which live process manages a host-scoped link and address
// (docs/operations.md). It sits beside the link's KANAL_LINK_ALIAS marker: the
// marker says "Kanal made this link", the lock says "and this Kanal process is
// still using it".
//
// The lock is a Linux abstract Unix socket. Its name lives in the network
// namespace, the same scope as the link it guards, whatever the mount
// namespace (systemd unit, static pod with hostNetwork); only one socket can
// hold a name; and the kernel frees the name when the holder exits, SIGKILL
// included. So a dead owner's leftover link is still reclaimed by its marker,
// while a live owner's is never touched. The holder answers every connection
// with one JSON line saying who it is, for the refusal message.
//
// Like a port, the name can be taken by any local process; one that squats it
// keeps the agent from starting (with a message naming the holder), which it
// could already do by binding the advertise address and port itself.

import net from 'node:net';

/** What a lock holder says about itself. */
export interface LockOwner {
  pid: number;
  agentID?: string;
}

/** The lock is held by another live process. */
export class OwnerLockHeldError extends Error {
  override name = 'OwnerLockHeldError';
  constructor(
    readonly resource: string,
    readonly owner: LockOwner | undefined,
  ) {
    const who = owner ? `pid ${owner.pid}${owner.agentID ? `, agent ID ${owner.agentID}` : ''}` : 'a process that did not say who it is';
    super(`${resource} is in use by another running kanal agent (${who}) in this network namespace`);
  }
}

export interface OwnerLock {
  readonly resource: string;
  release(): Promise<void>;
}

const NAME_PREFIX = 'kanal-agent:';
const OWNER_ANSWER_MAX_BYTES = 4096;

function abstractName(resource: string): string {
  return `\0${NAME_PREFIX}${resource}`;
}

function listen(server: net.Server, name: string): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen({ path: name }, () => {
      server.off('error', reject);
      resolve();
    });
  });
}

/** Asks the holder who it is; undefined when it does not answer within timeoutMs. */
function askOwner(name: string, timeoutMs: number): Promise<LockOwner | undefined> {
  return new Promise((resolve) => {
    const socket = net.connect({ path: name });
    let text = '';
    const done = (owner: LockOwner | undefined): void => {
      clearTimeout(timer);
      socket.destroy();
      resolve(owner);
    };
    const timer = setTimeout(() => done(undefined), timeoutMs);
    socket.setEncoding('utf8');
    socket.on('data', (chunk: string) => {
      text += chunk;
      if (text.length > OWNER_ANSWER_MAX_BYTES) done(undefined);
    });
    socket.on('end', () => done(parseOwner(text)));
    socket.on('error', () => done(undefined));
  });
}

function parseOwner(text: string): LockOwner | undefined {
  try {
    const v = JSON.parse(text) as { pid?: unknown; agentID?: unknown };
    if (typeof v.pid !== 'number') return undefined;
    return typeof v.agentID === 'string' ? { pid: v.pid, agentID: v.agentID } : { pid: v.pid };
  } catch {
    return undefined;
  }
}

/**
 * Takes the lock on `resource` (e.g. "link:kanal0") in this network namespace,
 * or throws OwnerLockHeldError naming the live holder. Never waits for the
 * holder: a second agent must fail at once, not queue behind the first.
 */
export async function acquireOwnerLock(resource: string, owner: LockOwner, askTimeoutMs = 1000): Promise<OwnerLock> {
  const name = abstractName(resource);
  const answer = `${JSON.stringify(owner)}\n`;
  const server = net.createServer((socket) => {
    socket.on('error', () => undefined);
    socket.end(answer);
  });
  // One retry: the holder may have exited between our bind and our question.
  for (let attempt = 1; ; attempt++) {
    try {
      await listen(server, name);
      break;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EADDRINUSE') throw err;
      const holder = await askOwner(name, askTimeoutMs);
      if (holder || attempt >= 2) throw new OwnerLockHeldError(resource, holder);
    }
  }
  server.unref();
  let released = false;
  return {
    resource,
    release: () =>
      new Promise<void>((resolve) => {
        if (released) return resolve();
        released = true;
        server.close(() => resolve());
      }),
  };
}
