/**
 * The SOCKS5 front door (RFC 1928, CONNECT only; RFC 1929 username/password):
 * for clients that speak SOCKS and not HTTP CONNECT (HyperShift's
 * konnectivity-socks5-proxy users, LDAP and gRPC clients, anything with
 * `ALL_PROXY=socks5h://`). Served on a listener of its own (`--socks5-port`,
 * `--socks5-uds-name`) or as a listener's `--mode socks5`; never in `both`,
 * so the kube-apiserver's listener is unchanged (docs/frontends.md, "SOCKS5").
 *
 * One connection is a Socks5Session: greeting, then (when the client offers
 * it) the username/password sub-negotiation whose password is the client's
 * token, then the request, then a dial through the tenant's frontend clients
 * (admit, then dial: the rules and limits every door shares), then the
 * success reply and the join. The head (greeting, sub-negotiation, request)
 * must be complete within the listener's head deadline and 1 KiB; a
 * malformed one gets the reply RFC 1928 has for it and the connection
 * closes. A client that chose no authentication is admitted by what its
 * connection says of it (a Unix socket's peer uid, a certificate, an
 * address): on a Unix socket the socket file's permissions decide who may
 * connect at all (docs/frontends.md, "SOCKS5: security model").
 */
import type { Duplex } from 'node:stream';
import { Cancel } from '../../common/cancel.js';
import { truncateForLog } from '../../common/log-safety.js';
import { errorMessage } from '../../common/error-message.js';
import { StateMachine, type Lifecycle } from '../../common/state-machine.js';
import type { Refusals } from '../../domain/refusal-log.js';
import type { RefusalReason } from '../../domain/refusal-reason.js';
import { DialError } from '../../tunnel/errors.js';
import { ClientRefused, type Dialed, type FrontendClient, type FrontendClients } from '../clients/frontend-client.js';
import { dropDialed, joinDialed } from '../clients/dialed.js';
import { watchDeparture } from './departure-watch.js';
import type { Frontend, FrontendContext, TenantFrontend } from './frontend.js';
import { parseGreeting, parseRequest, parseUserPass, SOCKS_VERSION, SocksMethod, type SocksParse } from './socks5-messages.js';
import {
  REP_FOR_FAILURE,
  SOCKS_AUTH_FAILURE,
  SOCKS_AUTH_SUCCESS,
  SOCKS_NO_ACCEPTABLE_METHOD,
  SOCKS_SUCCEEDED,
  socksMethodChoice,
  socksReply,
  SocksRep,
} from './socks5-reply-codes.js';

export const SOCKS5_DOOR = 'socks5';

export interface Socks5Limits {
  /** The whole head (greeting, sub-negotiation, request), bytes. */
  maxHeadBytes: number;
  /** Bytes a client may send after its request before the reply; reading pauses beyond. */
  maxEarlyBytes: number;
  /** How long a failure reply may take to reach a client that does not read, before the connection is cut. */
  lingerMs: number;
}

export const DEFAULT_SOCKS5_LIMITS: Socks5Limits = {
  maxHeadBytes: 1024,
  maxEarlyBytes: 64 * 1024,
  lingerMs: 5_000,
};

/** The SOCKS5 door: a connection whose first byte is version 5 (no other door's first byte is 0x05). */
export const socks5Frontend: Frontend<'socks5'> = {
  name: SOCKS5_DOOR,
  recognises: (first) => (first[0] === SOCKS_VERSION ? 'yes' : 'no'),
  forTenant: ({ clients, refusals }) => new Socks5Frontend(clients, refusals),
  serve(socket, context) {
    const tenant = context.server.tenantFrontend(context.connection.tenant, SOCKS5_DOOR);
    if (!tenant) {
      socket.destroy();
      return;
    }
    tenant.serve(socket, context);
    socket.resume();
  },
};

/** One tenant's part of the SOCKS5 door. */
export class Socks5Frontend implements TenantFrontend {
  private readonly limits: Socks5Limits;
  private open = 0;

  constructor(
    readonly clients: FrontendClients,
    readonly refusals: Refusals,
    limits: Partial<Socks5Limits> = {},
  ) {
    this.limits = { ...DEFAULT_SOCKS5_LIMITS, ...limits };
  }

  get size(): number {
    return this.open;
  }

  serve(socket: Duplex, context: Pick<FrontendContext, 'peer' | 'connection' | 'headDeadlineMs'>): void {
    this.open++;
    socket.once('close', () => this.open--);
    new Socks5Session(this, socket, context, this.limits);
  }
}

/**
 * A session's states. `admitting` waits for clients.admit (after the
 * sub-negotiation, or for a client without authentication after its
 * request, `then` says which); reading is paused meanwhile.
 */
type SessionState =
  | { readonly kind: 'greeting' }
  | { readonly kind: 'auth' }
  | { readonly kind: 'admitting'; readonly then: { readonly kind: 'request' } | { readonly kind: 'dial'; readonly address: string } }
  | { readonly kind: 'request'; readonly client: FrontendClient | undefined }
  | { readonly kind: 'dialling'; readonly client: FrontendClient; readonly address: string }
  | { readonly kind: 'joined' }
  | { readonly kind: 'closing' };

const SESSION_LIFECYCLE: Lifecycle<SessionState> = {
  name: 'socks5 session',
  moves: {
    greeting: ['auth', 'request', 'closing'],
    auth: ['admitting', 'closing'],
    admitting: ['request', 'dialling', 'closing'],
    request: ['admitting', 'dialling', 'closing'],
    dialling: ['joined', 'closing'],
    joined: [],
    closing: [],
  },
};

/** What happens to a session: its one transition function (Socks5Session.on) takes each. */
type SessionEvent =
  | { readonly kind: 'bytes' }
  | { readonly kind: 'end' }
  | { readonly kind: 'gone' }
  | { readonly kind: 'deadline' }
  | { readonly kind: 'admitted'; readonly client: FrontendClient }
  | { readonly kind: 'refused'; readonly err: unknown }
  | { readonly kind: 'dialled'; readonly dialed: Dialed }
  | { readonly kind: 'dial-failed'; readonly err: unknown };

/** The refusal reason a head state's malformed message counts as. */
const BAD_REASON: Record<'greeting' | 'auth' | 'request', RefusalReason> = {
  greeting: 'socks5_bad_greeting',
  auth: 'socks5_auth',
  request: 'socks5_bad_request',
};

/** The failure reply of a head state (a deadline, a FIN, an oversized head). */
const HEAD_FAILURE: Record<'greeting' | 'auth' | 'request', Buffer> = {
  greeting: SOCKS_NO_ACCEPTABLE_METHOD,
  auth: SOCKS_AUTH_FAILURE,
  request: socksReply(SocksRep.generalFailure),
};

class Socks5Session {
  private readonly machine = new StateMachine<SessionState>({ kind: 'greeting' }, SESSION_LIFECYCLE);
  /** What the client sent and no message has taken yet: the head's bytes, then its early bytes. */
  private buffered: Buffer = Buffer.alloc(0);
  /** Head bytes taken by complete messages. */
  private headBytes = 0;
  /** Aborted when the client goes, or the deadline passes: cancels a pending admit or dial. */
  private readonly cancel = new Cancel();
  private deadline: NodeJS.Timeout | undefined;
  /** After a FIN while dialling: stops looking for the client's departure (departure-watch.ts). */
  private stopWatch: () => void = () => undefined;
  /** The RFC 1929 username, for the log lines (informational: the password is the credential). */
  private username: string | undefined;

  constructor(
    private readonly door: Socks5Frontend,
    private readonly socket: Duplex,
    private readonly context: Pick<FrontendContext, 'peer' | 'connection' | 'headDeadlineMs'>,
    private readonly limits: Socks5Limits,
  ) {
    socket.on('data', this.onData);
    socket.on('end', this.onEnd);
    socket.on('error', this.onGone);
    socket.on('close', this.onGone);
    this.deadline = setTimeout(() => this.on({ kind: 'deadline' }), Math.max(0, context.headDeadlineMs));
  }

  private readonly onData = (chunk: Buffer): void => {
    this.buffered = this.buffered.length === 0 ? chunk : Buffer.concat([this.buffered, chunk]);
    this.on({ kind: 'bytes' });
  };
  private readonly onEnd = (): void => this.on({ kind: 'end' });
  private readonly onGone = (): void => this.on({ kind: 'gone' });

  /** The transition function: every event, in every state. */
  private on(event: SessionEvent): void {
    const state = this.machine.state;
    if (state.kind === 'joined' || state.kind === 'closing') {
      // Late answers: what was dialled for a client already answered goes.
      if (event.kind === 'dialled') dropDialed(event.dialed, new Error('SOCKS5 client went away before its reply'));
      return;
    }
    if (event.kind === 'gone') {
      this.cancel.abort();
      this.stop();
      this.machine.to({ kind: 'closing' });
      this.socket.destroy();
      return;
    }
    switch (state.kind) {
      case 'greeting':
      case 'auth':
      case 'request':
        this.onHead(state, event);
        return;
      case 'admitting':
        this.onAdmitting(state, event);
        return;
      case 'dialling':
        this.onDialling(event);
        return;
    }
  }

  /** Reading the head: each complete message moves on, a bad one (or a deadline, or a FIN) is answered and closed. */
  private onHead(state: Extract<SessionState, { kind: 'greeting' | 'auth' | 'request' }>, event: SessionEvent): void {
    if (event.kind === 'deadline') {
      this.refuse('frontend_header_timeout', 'timeout', 'closed SOCKS5 connection: head not complete in time');
      this.fail(HEAD_FAILURE[state.kind]);
      return;
    }
    if (event.kind === 'end') {
      this.refuse(BAD_REASON[state.kind], 'truncated', 'refused SOCKS5 connection: the client ended its head half way');
      this.fail(HEAD_FAILURE[state.kind]);
      return;
    }
    if (event.kind !== 'bytes') return;
    // Several messages may come in one chunk (a client that does not wait for each answer).
    for (;;) {
      const s = this.machine.state;
      if (s.kind === 'greeting') {
        const g = this.take(parseGreeting, s.kind);
        if (!g) return;
        if (g.methods.has(SocksMethod.userPass)) {
          this.socket.write(socksMethodChoice(SocksMethod.userPass));
          this.machine.to({ kind: 'auth' });
        } else if (g.methods.has(SocksMethod.noAuth) && this.context.peer.startsWith('unix:')) {
          // No authentication only where the socket file's permissions decide who connects; over TCP an address says nothing.
          this.socket.write(socksMethodChoice(SocksMethod.noAuth));
          this.machine.to({ kind: 'request', client: undefined });
        } else if (g.methods.has(SocksMethod.noAuth)) {
          this.refuse(
            'socks5_auth',
            'no_auth_over_tcp',
            'refused SOCKS5 connection: no authentication is accepted only on a Unix socket; send a username and password, the token as the password',
          );
          this.fail(SOCKS_NO_ACCEPTABLE_METHOD);
          return;
        } else {
          this.refuse(
            'socks5_auth',
            'no_acceptable_method',
            'refused SOCKS5 connection: neither username/password nor no authentication offered',
            {
              methods: [...g.methods],
            },
          );
          this.fail(SOCKS_NO_ACCEPTABLE_METHOD);
          return;
        }
      } else if (s.kind === 'auth') {
        const up = this.take(parseUserPass, s.kind);
        if (!up) return;
        this.username = truncateForLog(up.username, 64);
        this.admit(up.password || undefined, { kind: 'request' });
        return;
      } else if (s.kind === 'request') {
        const r = this.take(parseRequest, s.kind);
        if (!r) return;
        this.stopDeadline();
        if (s.client) this.dial(s.client, r.address);
        else this.admit(undefined, { kind: 'dial', address: r.address });
        return;
      } else {
        return;
      }
    }
  }

  /**
   * Runs `parse` on what is buffered: the message once complete (its bytes
   * taken), else undefined, having refused and closed on a bad or oversized head.
   */
  private take<T>(parse: (b: Buffer) => SocksParse<T>, where: 'greeting' | 'auth' | 'request'): T | undefined {
    const p = parse(this.buffered);
    if (p.kind === 'bad') {
      this.refuse(
        where === 'request' && p.code === 'request_command' ? 'socks5_command' : BAD_REASON[where],
        p.code,
        `refused SOCKS5 ${where}: ${p.message}`,
      );
      this.fail(p.reply);
      return undefined;
    }
    const size = this.headBytes + (p.kind === 'done' ? p.used : this.buffered.length);
    if (size > this.limits.maxHeadBytes) {
      this.refuse(
        BAD_REASON[where],
        'head_too_large',
        `refused SOCKS5 ${where}: the head is longer than ${this.limits.maxHeadBytes} bytes`,
      );
      this.fail(HEAD_FAILURE[where]);
      return undefined;
    }
    if (p.kind === 'more') return undefined;
    this.headBytes += p.used;
    this.buffered = this.buffered.subarray(p.used);
    return p.value;
  }

  private admit(token: string | undefined, then: Extract<SessionState, { kind: 'admitting' }>['then']): void {
    this.machine.to({ kind: 'admitting', then });
    // What the client sends meanwhile waits in the kernel: the admission decides what it may send.
    this.socket.pause();
    const { connection } = this.context;
    this.door.clients
      .admit({ identity: connection.client, ...(token === undefined ? {} : { token }), door: SOCKS5_DOOR }, this.cancel)
      .then(
        (client) => this.on({ kind: 'admitted', client }),
        (err: unknown) => this.on({ kind: 'refused', err }),
      );
  }

  private onAdmitting(state: Extract<SessionState, { kind: 'admitting' }>, event: SessionEvent): void {
    if (event.kind === 'deadline') {
      this.refuse('frontend_header_timeout', 'timeout', 'closed SOCKS5 connection: admission not decided in time');
      this.cancel.abort();
      this.fail(state.then.kind === 'request' ? SOCKS_AUTH_FAILURE : socksReply(SocksRep.generalFailure));
      return;
    }
    if (event.kind === 'admitted') {
      if (state.then.kind === 'request') {
        this.socket.write(SOCKS_AUTH_SUCCESS);
        this.machine.to({ kind: 'request', client: event.client });
        this.socket.resume();
        // The request may have come with the sub-negotiation.
        if (this.buffered.length > 0) this.on({ kind: 'bytes' });
      } else {
        this.dial(event.client, state.then.address);
      }
      return;
    }
    if (event.kind === 'refused') {
      const refused = event.err instanceof ClientRefused;
      this.refuse('socks5_auth', refused ? `refused_${event.err.status}` : 'admission_failed', 'refused SOCKS5 client', {
        err: truncateForLog(errorMessage(event.err), 1024),
        ...(this.username === undefined ? {} : { username: this.username }),
      });
      // RFC 1929: a failure status, then the server closes; without authentication, "not allowed by ruleset".
      this.fail(state.then.kind === 'request' ? SOCKS_AUTH_FAILURE : socksReply(SocksRep.notAllowed));
    }
    // 'bytes' and 'end' cannot come while paused; a FIN read before the pause is seen again by the next state.
  }

  private dial(client: FrontendClient, address: string): void {
    this.machine.to({ kind: 'dialling', client, address });
    this.stopDeadline();
    // Early bytes: read on, up to the bound, so a client that ends early is seen (its FIN follows its bytes).
    if (this.buffered.length < this.limits.maxEarlyBytes) this.socket.resume();
    else this.socket.pause();
    this.door.clients.dial(client, address, this.cancel).then(
      (dialed) => this.on({ kind: 'dialled', dialed }),
      (err: unknown) => this.on({ kind: 'dial-failed', err }),
    );
  }

  private onDialling(event: SessionEvent): void {
    if (event.kind === 'bytes') {
      // A client this eager is held back; the dial timeout still bounds its wait.
      if (this.buffered.length >= this.limits.maxEarlyBytes) this.socket.pause();
      return;
    }
    if (event.kind === 'dialled') {
      this.join(event.dialed);
      return;
    }
    if (event.kind === 'dial-failed') {
      const err = event.err;
      const rep = err instanceof DialError ? REP_FOR_FAILURE[err.failure] : SocksRep.generalFailure;
      // Not a refusal of the door's: the dial's own path counted and audited it (kanal_dials_total).
      this.fail(socksReply(rep));
    }
    // 'end': a half-close; the dial goes on and the FIN follows the early bytes (the splice passes it on),
    // unless the client turns out to have gone meanwhile: that cancels the dial.
    if (event.kind === 'end') this.stopWatch = watchDeparture(this.socket, this.onGone);
  }

  private join(dialed: Dialed): void {
    this.stop();
    this.machine.to({ kind: 'joined' });
    const s = this.socket;
    if (s.destroyed) {
      dropDialed(dialed, new Error('SOCKS5 client went away before its reply'));
      return;
    }
    s.pause();
    const early = this.buffered;
    this.buffered = Buffer.alloc(0);
    // The reply goes out before the first byte of the destination: a backend that speaks first must not overtake it.
    s.write(SOCKS_SUCCEEDED);
    if (dialed.via === 'tunnel') {
      if (early.length > 0) dialed.conn.send(early);
      joinDialed(s, dialed);
    } else {
      if (early.length > 0) dialed.socket.write(early);
      joinDialed(s, dialed);
      // pipe() passes on no FIN that came before it.
      if (s.readableEnded) dialed.socket.end();
    }
  }

  private refuse(reason: RefusalReason, detail: string, message: string, fields: Record<string, unknown> = {}): void {
    this.door.refusals.refuse({ reason, peer: this.context.peer, fields: { code: detail, ...fields }, message, detail });
  }

  private stopDeadline(): void {
    clearTimeout(this.deadline);
    this.deadline = undefined;
  }

  /** The session's listeners go (the joined socket belongs to the splice from here). */
  private stop(): void {
    this.stopDeadline();
    this.stopWatch();
    this.socket.off('data', this.onData);
    this.socket.off('end', this.onEnd);
    this.socket.off('error', this.onGone);
    this.socket.off('close', this.onGone);
  }

  /**
   * Writes a failure reply and closes: reads (and drops) what the client
   * still sends so closing does not reset the reply away, and cuts the
   * connection after lingerMs whatever the client does.
   */
  private fail(reply: Buffer): void {
    this.stop();
    this.cancel.abort();
    this.machine.to({ kind: 'closing' });
    const s = this.socket;
    s.on('error', () => undefined);
    if (s.destroyed) return;
    const timer = setTimeout(() => s.destroy(), this.limits.lingerMs);
    timer.unref();
    s.once('close', () => clearTimeout(timer));
    s.on('data', () => undefined);
    s.once('end', () => s.destroy());
    if (s.readableEnded) s.once('finish', () => s.destroy());
    s.end(reply);
    s.resume();
  }
}
