/**
 * The stream gateway (docs/api.md §4.6): one TCP listener per agent through which any VNC client reaches
 * a desktop's screen.
 *
 * The scheduler asks the agent for a ticket (`grant`); the client dials the gateway and sends
 * that ticket as its first line, `<ticket>\n`. A good ticket starts a VNC server for this one
 * client inside the desktop (view-only for a `view` claim) and from then on the gateway only
 * relays bytes both ways, so the client's first bytes are the server's RFB greeting and any VNC
 * client works once it can send one line. A bad one gets `ERR <code>\n` and the connection is
 * closed. Tickets and claims are kept by the ticket book (tickets.ts); the gateway ends a
 * connection's lease when the connection closes, which frees its claim.
 *
 * The same port takes WebSockets for browsers (websockets.ts): `/vnc` with a stream ticket relays
 * RFB in binary frames, `/terminal` with a terminal ticket (terminal-tickets.ts) a pty inside the
 * desktop. A first line that starts with `GET ` is an HTTP request; a ticket never does.
 *
 * Nothing here logs a ticket, and every timer is unref'd: the gateway never keeps the agent alive.
 */
import type { Socket } from 'node:net';
import type { WebSocket, WebSocketServer } from 'ws';
import type { StreamClaim } from '../../../shared/src/computer-use.js';
import { AgentFailure } from '../../../shared/src/protocol.js';
import { HandshakeSlots, LineListener, LINGER_MS, refuseWithLine } from '../line-listener.js';
import type { TerminalSession, TerminalSpec, VncSession } from '../runtime/driver.js';
import { TerminalTicketBook, type TerminalLease } from './terminal-tickets.js';
import { TicketBook, type Lease } from './tickets.js';
import { answerHttp, closeWith, isHttpRequestLine, readHttpHead, relayTerminal, relayVnc, upgrade, webSocketServer } from './websockets.js';

export interface StreamGatewayOptions {
  /** Address to listen on. */
  readonly listenHost: string;
  /** TCP port; 0 picks a free one (see `port`). */
  readonly port: number;
  /** Host name clients are told to dial. */
  readonly advertiseHost: string;
  /** Starts a VNC server for one client (RuntimeDriver.openVnc). */
  readonly open: (desktopId: string, viewOnly: boolean) => Promise<VncSession>;
  /** Starts a terminal for one client (RuntimeDriver.openTerminal); without it terminals are refused. */
  readonly openTerminal?: (desktopId: string, spec: TerminalSpec) => Promise<TerminalSession>;
  /** The desktop generation this host holds; a terminal ticket of another generation is refused. */
  readonly generationOf?: (desktopId: string) => number | undefined;
  /** Ticket lifetime. Default 60 000 ms. */
  readonly ticketTtlMs?: number;
  /** How long a client has to send its ticket line. Default 10 000 ms. */
  readonly handshakeTimeoutMs?: number;
  readonly log: (msg: string, fields?: object) => void;
}

export interface StreamGrant {
  readonly ticket: string;
  readonly expiresAt: Date;
  readonly host: string;
  readonly port: number;
}

/** What a refused client reads before the connection closes. */
export type StreamRefusal = 'invalid_ticket' | 'expired_ticket' | 'not_running' | 'unavailable';

const DEFAULT_TTL_MS = 60_000;
const DEFAULT_HANDSHAKE_MS = 10_000;
/** The ticket line, newline included. */
const MAX_LINE_BYTES = 256;

/** A client that presented a good ticket, from then until its connection closes. */
interface Connection {
  readonly socket: Socket;
  readonly lease: Lease;
  readonly since: number;
  /** The server starting; settles once it is running or failed. */
  opening: Promise<VncSession | null>;
  session: VncSession | null;
}

/** A WebSocket client (a browser's screen or terminal), from its upgrade until it closes. */
interface WsConnection {
  readonly desktopId: string;
  readonly ws: WebSocket;
}

export class StreamGateway {
  private readonly book: TicketBook;
  private readonly terminals: TerminalTicketBook;
  private readonly connections = new Set<Connection>();
  private readonly wsConnections = new Set<WsConnection>();
  private readonly wss: WebSocketServer = webSocketServer();
  private readonly pending = new Set<Promise<unknown>>();
  private readonly readingHeads = new HandshakeSlots();
  private listener!: LineListener;

  private constructor(private readonly options: StreamGatewayOptions) {
    this.book = new TicketBook(options.ticketTtlMs ?? DEFAULT_TTL_MS);
    this.terminals = new TerminalTicketBook(options.ticketTtlMs ?? DEFAULT_TTL_MS);
  }

  static async start(options: StreamGatewayOptions): Promise<StreamGateway> {
    const gateway = new StreamGateway(options);
    gateway.listener = await LineListener.start({
      listenHost: options.listenHost,
      port: options.port,
      maxLineBytes: MAX_LINE_BYTES,
      handshakeTimeoutMs: options.handshakeTimeoutMs ?? DEFAULT_HANDSHAKE_MS,
      name: 'stream gateway',
      log: options.log,
      onLine: (socket, line, early) => gateway.track(isHttpRequestLine(line) ? gateway.beginHttp(socket, line, early) : gateway.begin(socket, line, early)),
      // An over-long line is answered; silence and a client gone before its ticket are not.
      onNoLine: (socket, why) => (why === 'too_long' ? gateway.refuse(socket, 'invalid_ticket', null) : socket.destroy()),
    });
    return gateway;
  }

  get port(): number {
    return this.listener.port;
  }

  /**
   * Issues a single-use ticket; `control_claimed` or `too_large` when the claim cannot be had.
   * With `generation`, the ticket opens a session only while the desktop is at that generation
   * here, as a terminal ticket does: one granted before a move and its return (or a recovery
   * elsewhere) is refused.
   */
  grant(desktopId: string, claim: StreamClaim, generation?: number): StreamGrant {
    if (this.listener.closing) throw new AgentFailure('runtime_error', 'the stream gateway is closed', true);
    const { ticket, expiresAt } = this.book.issue({ desktopId, claim, ...(generation === undefined ? {} : { generation }) });
    this.options.log('stream ticket granted', { desktopId, claim, expiresAt: new Date(expiresAt).toISOString() });
    return { ticket, expiresAt: new Date(expiresAt), host: this.options.advertiseHost, port: this.port };
  }

  /**
   * Issues a single-use terminal ticket for the desktop's current generation; `too_large` when
   * the desktop has its share of terminals, `unsupported` when this host cannot make them.
   */
  grantTerminal(desktopId: string, generation: number, spec: TerminalSpec): StreamGrant {
    if (this.listener.closing) throw new AgentFailure('runtime_error', 'the stream gateway is closed', true);
    if (this.options.openTerminal === undefined) throw new AgentFailure('unsupported', 'this host has no terminals', false);
    const { ticket, expiresAt } = this.terminals.issue({ desktopId, generation, spec });
    this.options.log('terminal ticket granted', { desktopId, generation, expiresAt: new Date(expiresAt).toISOString() });
    return { ticket, expiresAt: new Date(expiresAt), host: this.options.advertiseHost, port: this.port };
  }

  /** True while a client holds, or an unused ticket reserves, the desktop's control claim. */
  controlHeld(desktopId: string): boolean {
    return this.book.controlHeld(desktopId);
  }

  /** The desktop stops: its unused tickets die, its connections close, its claims are free. */
  release(desktopId: string): void {
    this.book.release(desktopId);
    this.terminals.release(desktopId);
    for (const conn of this.connections) {
      if (conn.lease.desktopId === desktopId) this.hangUp(conn);
    }
    for (const conn of this.wsConnections) {
      if (conn.desktopId === desktopId) closeWith(conn.ws, 'going_away');
    }
  }

  async close(): Promise<void> {
    const sessions = [...this.connections].map((conn) => conn.opening.then((session) => session?.closed));
    for (const conn of this.wsConnections) closeWith(conn.ws, 'going_away');
    const closed = this.listener.close();
    this.book.clear();
    this.terminals.clear();
    await Promise.all([closed, ...sessions, ...this.pending]);
  }

  /** Keeps a connection's start in view until it settles, so that `close` waits for what it opens. */
  private track(work: Promise<void>): void {
    this.pending.add(work);
    void work.finally(() => this.pending.delete(work));
  }

  /** An HTTP request on the gateway's port: a WebSocket for `/vnc` or `/terminal`, or a refusal. */
  private async beginHttp(socket: Socket, line: string, early: Buffer): Promise<void> {
    // The line listener's cap on connections owing their first line ends with that line: request
    // heads still being read have a cap of their own.
    // The same fair share as the first lines': one address holding heads unfinished cannot take
    // every slot and lock every other viewer out.
    const address = socket.remoteAddress ?? '';
    if (!this.readingHeads.take(address)) {
      socket.destroy();
      return;
    }
    const read = await readHttpHead(socket, line, early, this.options.handshakeTimeoutMs ?? DEFAULT_HANDSHAKE_MS);
    this.readingHeads.give(address);
    if (read === null) return;
    const { head, rest } = read;
    if (head.path !== '/vnc' && head.path !== '/terminal') {
      answerHttp(socket, 404, 'Not Found');
      return;
    }
    const ws = this.listener.closing ? null : await upgrade(this.wss, socket, head, rest);
    if (ws === null) {
      socket.destroy();
      return;
    }
    ws.on('error', () => undefined);
    // What the client sends before its session is open (keystrokes, RFB) waits in the socket.
    ws.pause();
    const ticket = head.query.get('ticket') ?? '';
    if (head.path === '/vnc') await this.serveVnc(ws, ticket, socket);
    else await this.serveTerminal(ws, ticket, socket);
  }

  private async serveVnc(ws: WebSocket, ticket: string, socket: Socket): Promise<void> {
    const lease = this.book.redeem(ticket);
    if (typeof lease === 'string') {
      this.refuseWs(ws, socket, lease, null);
      return;
    }
    if (this.outdated(lease)) {
      this.book.end(lease);
      this.refuseWs(ws, socket, 'not_running', lease.desktopId);
      return;
    }
    const since = performance.now();
    const conn: WsConnection = { desktopId: lease.desktopId, ws };
    this.wsConnections.add(conn);
    ws.once('close', () => {
      this.wsConnections.delete(conn);
      this.book.end(lease);
    });
    let session: VncSession;
    try {
      session = await this.options.open(lease.desktopId, lease.claim === 'view');
    } catch (err) {
      this.refuseWs(ws, socket, isGone(err) ? 'not_running' : 'unavailable', lease.desktopId, err);
      return;
    }
    if (ws.readyState !== ws.OPEN) {
      session.close();
      return;
    }
    relayVnc(ws, session);
    this.options.log('stream session started', {
      desktopId: lease.desktopId, claim: lease.claim, websocket: true, remote: socket.remoteAddress, ms: Math.round(performance.now() - since),
    });
    ws.once('close', () => this.options.log('stream session ended', {
      desktopId: lease.desktopId, claim: lease.claim, websocket: true, durationMs: Math.round(performance.now() - since),
    }));
  }

  private async serveTerminal(ws: WebSocket, ticket: string, socket: Socket): Promise<void> {
    const redeemed = this.terminals.redeem(ticket);
    if (typeof redeemed === 'string') {
      this.refuseWs(ws, socket, redeemed, null);
      return;
    }
    const lease: TerminalLease = redeemed;
    const conn: WsConnection = { desktopId: lease.desktopId, ws };
    this.wsConnections.add(conn);
    ws.once('close', () => {
      this.wsConnections.delete(conn);
      this.terminals.end(lease);
    });
    // A desktop recovered elsewhere (or moved back) has a newer generation: the ticket was for the old one.
    const held = this.options.generationOf?.(lease.desktopId);
    if (held !== undefined && held !== lease.generation) {
      this.refuseWs(ws, socket, 'not_running', lease.desktopId);
      return;
    }
    const since = performance.now();
    let session: TerminalSession;
    try {
      if (this.options.openTerminal === undefined) throw new AgentFailure('unsupported', 'this host has no terminals', false);
      session = await this.options.openTerminal(lease.desktopId, lease.spec);
    } catch (err) {
      this.refuseWs(ws, socket, isGone(err) ? 'not_running' : 'unavailable', lease.desktopId, err);
      return;
    }
    if (ws.readyState !== ws.OPEN) {
      session.close();
      return;
    }
    relayTerminal(ws, session);
    this.options.log('terminal session started', { desktopId: lease.desktopId, remote: socket.remoteAddress, ms: Math.round(performance.now() - since) });
    ws.once('close', () => this.options.log('terminal session ended', {
      desktopId: lease.desktopId, bytesIn: socket.bytesRead, bytesOut: socket.bytesWritten, durationMs: Math.round(performance.now() - since),
    }));
  }

  private refuseWs(ws: WebSocket, socket: Socket, code: StreamRefusal, desktopId: string | null, err?: unknown): void {
    this.options.log('stream connection refused', {
      code, websocket: true, remote: socket.remoteAddress, desktopId: desktopId ?? undefined, ...(err === undefined ? {} : { error: String(err) }),
    });
    closeWith(ws, code);
  }

  private async begin(socket: Socket, line: string, early: Buffer): Promise<void> {
    if (this.listener.closing) {
      socket.destroy();
      return;
    }
    const lease = this.book.redeem(line);
    if (typeof lease === 'string') {
      this.refuse(socket, lease, null);
      return;
    }
    if (this.outdated(lease)) {
      this.book.end(lease);
      this.refuse(socket, 'not_running', lease);
      return;
    }
    const opening = this.options.open(lease.desktopId, lease.claim === 'view');
    const conn: Connection = { socket, lease, since: performance.now(), opening: opening.catch(() => null), session: null };
    this.connections.add(conn);
    socket.once('close', () => this.finish(conn));
    let session: VncSession;
    try {
      session = await opening;
    } catch (err) {
      this.refuse(socket, isGone(err) ? 'not_running' : 'unavailable', lease, err);
      return;
    }
    if (socket.destroyed) {
      // The client left, or the desktop was released, while the server started.
      session.close();
      return;
    }
    conn.session = session;
    this.relay(conn, session, early);
  }

  /** Client → server and server → client, each side ending the other. */
  private relay(conn: Connection, session: VncSession, early: Buffer): void {
    const { socket, lease } = conn;
    this.options.log('stream session started', {
      desktopId: lease.desktopId, claim: lease.claim, remote: socket.remoteAddress, ms: Math.round(performance.now() - conn.since),
    });
    session.input.on('error', () => socket.destroy());
    session.output.on('error', () => socket.destroy());
    if (early.length > 0) session.input.write(early);
    session.output.pipe(socket);
    socket.pipe(session.input);
    // The server is gone: what it sent is flushed by the pipe's end, then the connection closes.
    void session.closed.then(() => this.hangUp(conn, LINGER_MS));
  }

  /** A ticket granted at another generation than the one this host holds of the desktop now. */
  private outdated(lease: Lease): boolean {
    if (lease.generation === undefined) return false;
    const held = this.options.generationOf?.(lease.desktopId);
    return held !== undefined && held !== lease.generation;
  }

  /** Logs the refusal (never the ticket) and answers it with `ERR <code>`. */
  private refuse(socket: Socket, code: StreamRefusal, lease: Lease | null, err?: unknown): void {
    this.options.log('stream connection refused', {
      code, remote: socket.remoteAddress, desktopId: lease?.desktopId, ...(err === undefined ? {} : { error: String(err) }),
    });
    refuseWithLine(socket, code);
  }

  /** Closes the connection: at once, or after ending it and a grace for the last bytes. */
  private hangUp(conn: Connection, graceMs = 0): void {
    if (graceMs === 0) {
      conn.socket.destroy();
      return;
    }
    conn.socket.end();
    const timer = setTimeout(() => conn.socket.destroy(), graceMs);
    timer.unref();
    conn.socket.once('close', () => clearTimeout(timer));
  }

  private finish(conn: Connection): void {
    if (!this.connections.delete(conn)) return;
    this.book.end(conn.lease);
    if (conn.session === null) return;
    conn.session.close();
    this.options.log('stream session ended', {
      desktopId: conn.lease.desktopId, claim: conn.lease.claim,
      bytesIn: conn.socket.bytesRead, bytesOut: conn.socket.bytesWritten,
      durationMs: Math.round(performance.now() - conn.since),
    });
  }
}

/** The desktop is not running here (any more): its sessions cannot start. */
function isGone(err: unknown): boolean {
  return err instanceof AgentFailure && (err.code === 'not_running' || err.code === 'not_found');
}
