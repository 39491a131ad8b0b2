/** Request/response over the IPC channel between the bench driver and its worker processes. */
import type { Child } from './children.js';

export type CommandMap = Record<string, { args: unknown; result: unknown }>;

export type Handlers<C extends CommandMap> = { [K in keyof C]: (args: C[K]['args']) => Promise<C[K]['result']> | C[K]['result'] };

interface Request {
  id: number;
  cmd: string;
  args: unknown;
}

interface Response {
  id: number;
  ok: boolean;
  result?: unknown;
  error?: string;
}

/** Driver side: a worker process that answers commands of map C. */
export class Worker<C extends CommandMap> {
  private nextId = 1;
  private readonly waiting = new Map<number, { resolve(v: unknown): void; reject(e: Error): void }>();

  constructor(readonly child: Child) {
    child.proc.on('message', (raw) => {
      const msg = raw as Response;
      const w = this.waiting.get(msg.id);
      if (!w) return;
      this.waiting.delete(msg.id);
      if (msg.ok) w.resolve(msg.result);
      else w.reject(new Error(`${child.name}: ${msg.error ?? 'failed'}`));
    });
    void child.exited.then(({ code }) => {
      for (const w of this.waiting.values()) w.reject(new Error(`${child.name} exited (${code}); log: ${child.tail(5)}`));
      this.waiting.clear();
    });
  }

  get pid(): number {
    return this.child.pid;
  }

  call<K extends keyof C & string>(cmd: K, args: C[K]['args'], timeoutMs = 60_000): Promise<C[K]['result']> {
    const id = this.nextId++;
    return new Promise<C[K]['result']>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiting.delete(id);
        reject(new Error(`${this.child.name}: ${cmd} timed out after ${timeoutMs} ms`));
      }, timeoutMs);
      this.waiting.set(id, {
        resolve: (v) => {
          clearTimeout(timer);
          resolve(v);
        },
        reject: (e) => {
          clearTimeout(timer);
          reject(e);
        },
      });
      const req: Request = { id, cmd, args };
      this.child.proc.send(req, (err) => {
        if (err) this.waiting.get(id)?.reject(err);
      });
    });
  }
}

/** Worker side: answers commands until the driver goes away. */
export function serveCommands<C extends CommandMap>(handlers: Handlers<C>): void {
  if (!process.send) throw new Error('bench worker started without an IPC channel');
  const send = (r: Response): void => {
    process.send?.(r);
  };
  process.on('message', (raw) => {
    const req = raw as Request;
    const handler = (handlers as Record<string, ((args: unknown) => unknown) | undefined>)[req.cmd];
    if (!handler) {
      send({ id: req.id, ok: false, error: `unknown command ${req.cmd}` });
      return;
    }
    Promise.resolve()
      .then(() => handler(req.args))
      .then(
        (result) => send({ id: req.id, ok: true, result }),
        (err: Error) => send({ id: req.id, ok: false, error: err.stack ?? err.message }),
      );
  });
  // The driver is gone (finished, crashed or killed): nothing left to do here.
  process.on('disconnect', () => process.exit(0));
}
