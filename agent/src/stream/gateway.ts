/**
 * The stream gateway (SPEC 4.6): one TCP listener per agent through which any VNC client reaches
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
 * Nothing here logs a ticket, and every timer is unref'd: the gateway never keeps the agent alive.
 */
import { createServer, type Server, type Socket } from 'node:net';
import type { StreamClaim } from '../../../shared/src/computer-use.js';
import { AgentFailure } from '../../../shared/src/protocol.js';
import type { VncSession } from '../runtime/driver.js';
import { TicketBook, type Lease } from './tickets.js';

export interface StreamGatewayOptions {
  /** Address to listen on. */
  readonly listenHost: string;
  /** TCP port; 0 picks a free one (see `port`). */
  readonly port: number;
  /** Host name clients are told to dial. */
  readonly advertiseHost: string;
  /** Starts a VNC server for one client (RuntimeDriver.openVnc). */
  readonly open: (desktopId: string, viewOnly: boolean) => Promise<VncSession>;
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
/** Connections that have not presented a ticket yet; more are dropped at once. */
const MAX_HANDSHAKES = 64;
/** How long a closing connection may stay half-open for its last bytes to reach the client. */
const LINGER_MS = 2_000;
/** Dead clients are found by TCP keepalive, so that their control claim does not stay held. */
const KEEPALIVE_MS = 30_000;

/** A client that presented a good ticket, from then until its connection closes. */
interface Connection {
  readonly socket: Socket;
  readonly lease: Lease;
  readonly since: number;
  /** The server starting; settles once it is running or failed. */
  opening: Promise<VncSession | null>;
  session: VncSession | null;
}

export class StreamGateway {
  private readonly book: TicketBook;
  /** Every open client connection, whatever its state. */
  private readonly sockets = new Set<Socket>();
  private readonly handshakes = new Set<Socket>();
  private readonly connections = new Set<Connection>();
  private closing = false;

  private constructor(
    private readonly server: Server,
    private readonly options: StreamGatewayOptions,
    readonly port: number,
  ) {
    this.book = new TicketBook(options.ticketTtlMs ?? DEFAULT_TTL_MS);
    server.on('connection', (socket) => this.accept(socket));
  }

  static async start(options: StreamGatewayOptions): Promise<StreamGateway> {
    const server = createServer({ noDelay: true, keepAlive: true, keepAliveInitialDelay: KEEPALIVE_MS });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(options.port, options.listenHost, () => {
        server.off('error', reject);
        resolve();
      });
    });
    // A failing accept must not crash the agent.
    server.on('error', (err) => options.log('stream gateway error', { error: String(err) }));
    const address = server.address();
    const port = typeof address === 'object' && address !== null ? address.port : options.port;
    options.log('stream gateway listening', { host: options.listenHost, port });
    return new StreamGateway(server, options, port);
  }

  /** Issues a single-use ticket; `control_claimed` or `too_large` when the claim cannot be had. */
  grant(desktopId: string, claim: StreamClaim): StreamGrant {
    if (this.closing) throw new AgentFailure('runtime_error', 'the stream gateway is closed', true);
    const { ticket, expiresAt } = this.book.issue(desktopId, claim);
    this.options.log('stream ticket granted', { desktopId, claim, expiresAt: new Date(expiresAt).toISOString() });
    return { ticket, expiresAt: new Date(expiresAt), host: this.options.advertiseHost, port: this.port };
  }

  /** True while a client holds, or an unused ticket reserves, the desktop's control claim. */
  controlHeld(desktopId: string): boolean {
    return this.book.controlHeld(desktopId);
  }

  /** The desktop stops: its unused tickets die, its connections close, its claims are free. */
  release(desktopId: string): void {
    this.book.release(desktopId);
    for (const conn of this.connections) {
      if (conn.lease.desktopId === desktopId) this.hangUp(conn);
    }
  }

  async close(): Promise<void> {
    this.closing = true;
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    const sessions = [...this.connections].map((conn) => conn.opening.then((session) => session?.closed));
    for (const socket of this.sockets) socket.destroy();
    this.book.clear();
    await Promise.all([closed, ...sessions]);
  }

  /** Reads the ticket line, with a deadline and a length limit. */
  private accept(socket: Socket): void {
    socket.on('error', () => undefined);
    if (this.closing || this.handshakes.size >= MAX_HANDSHAKES) {
      socket.destroy();
      return;
    }
    this.sockets.add(socket);
    socket.once('close', () => this.sockets.delete(socket));
    this.handshakes.add(socket);
    let head: Buffer = Buffer.alloc(0);
    const timer = setTimeout(() => socket.destroy(), this.options.handshakeTimeoutMs ?? DEFAULT_HANDSHAKE_MS);
    timer.unref();
    const done = () => {
      clearTimeout(timer);
      socket.off('data', onData);
      this.handshakes.delete(socket);
    };
    const onData = (chunk: Buffer) => {
      head = head.length === 0 ? chunk : Buffer.concat([head, chunk]);
      const nl = head.indexOf(0x0a);
      if (nl < 0 && head.length < MAX_LINE_BYTES) return;
      done();
      if (nl < 0 || nl >= MAX_LINE_BYTES) {
        this.refuse(socket, 'invalid_ticket', null);
        return;
      }
      // Anything after the line is the client's first RFB bytes: hold them until the server runs.
      socket.pause();
      const line = head.subarray(0, nl).toString('latin1').replace(/\r$/, '');
      void this.begin(socket, line, head.subarray(nl + 1));
    };
    socket.on('data', onData);
    socket.once('close', done);
  }

  private async begin(socket: Socket, line: string, early: Buffer): Promise<void> {
    if (this.closing) {
      socket.destroy();
      return;
    }
    const lease = this.book.redeem(line);
    if (typeof lease === 'string') {
      this.refuse(socket, lease, null);
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
      const gone = err instanceof AgentFailure && (err.code === 'not_running' || err.code === 'not_found');
      this.refuse(socket, gone ? 'not_running' : 'unavailable', lease, err);
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

  /** Writes `ERR <code>` and closes; unread input is drained so the line is not lost to a reset. */
  private refuse(socket: Socket, code: StreamRefusal, lease: Lease | null, err?: unknown): void {
    this.options.log('stream connection refused', {
      code, remote: socket.remoteAddress, desktopId: lease?.desktopId, ...(err === undefined ? {} : { error: String(err) }),
    });
    if (socket.destroyed) return;
    socket.end(`ERR ${code}\n`);
    socket.resume();
    const timer = setTimeout(() => socket.destroy(), LINGER_MS);
    timer.unref();
    socket.once('close', () => clearTimeout(timer));
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
