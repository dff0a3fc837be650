/**
 * What the agent's two TCP gateways share (stream/gateway.ts for VNC clients, ports/gateway.ts
 * for the scheduler's ingress): a listener whose clients open with one line — a ticket, a signed
 * target — before anything else. It reads that line with a length limit and a deadline, caps the
 * connections still owing one (in all, and per client address when slots run short), and hands
 * the line and whatever bytes followed it to the gateway; the gateway decides what the line means
 * and relays from there. A refusal is one `ERR` line.
 *
 * Every timer is unref'd and every socket error is swallowed here: a gateway never keeps the
 * agent alive, and a failing connection only ever closes itself.
 */
import { createServer, type Server, type Socket } from 'node:net';

export interface LineListenerOptions {
  /** Address and TCP port to listen on; port 0 picks a free one (see `port`). */
  readonly listenHost: string;
  readonly port: number;
  /** The line, newline included, must fit in this many bytes. */
  readonly maxLineBytes: number;
  readonly handshakeTimeoutMs: number;
  /** Keep a client's half-close from ending our side too (the answer may still be flowing). */
  readonly allowHalfOpen?: boolean;
  /** For the log lines, e.g. `stream gateway`. */
  readonly name: string;
  readonly log: (msg: string, fields?: object) => void;
  /** A line (without its newline or a trailing CR) and the bytes after it; the socket is paused. */
  readonly onLine: (socket: Socket, line: string, early: Buffer) => void;
  /** No usable line: over the limit, not in time, or the client ended first. */
  readonly onNoLine: (socket: Socket, why: 'too_long' | 'timeout' | 'ended') => void;
}

/**
 * Connections that have not sent their line yet; more are dropped at once. A silent connection
 * costs the agent a socket and a timer, so the cap is high: with 64, five addresses holding
 * silent connections open (reconnecting as the deadline closes them) locked every viewer, or
 * the ingress, out of a host.
 */
export const MAX_HANDSHAKES = 1024;
/**
 * The same, per client network (a /24 of IPv4, a /64 of IPv6: what one client can hold as
 * easily as one address), once half the slots are taken: one client holding silent connections
 * open cannot take every slot and lock every other client out, and it takes nine networks to
 * fill them. Below that there is no per-network limit, because one address is often many honest
 * clients at once: the scheduler's ingress opens a link per request, and a burst of more than
 * eight requests to an exposed port must not be refused (it was, as 503s).
 */
export const MAX_HANDSHAKES_PER_ADDRESS = 64;
export const FAIR_SHARE_FROM = MAX_HANDSHAKES / 2;

/**
 * The network a client address belongs to for the per-client share: its /24 (IPv4, also written
 * as an IPv4-mapped IPv6 address) or its /64 (IPv6). Anything else stands for itself.
 */
export function clientNetwork(address: string): string {
  const v4 = /^(?:::ffff:)?(\d+)\.(\d+)\.(\d+)\.\d+$/i.exec(address);
  if (v4 !== null) return `${v4[1]}.${v4[2]}.${v4[3]}`;
  if (!address.includes(':')) return address;
  const bare = address.replace(/%.*$/, '').toLowerCase();
  const [head = '', tail] = bare.split('::');
  const left = head === '' ? [] : head.split(':');
  const right = tail === undefined || tail === '' ? [] : tail.split(':');
  const groups = tail === undefined ? left : [...left, ...Array<string>(Math.max(0, 8 - left.length - right.length)).fill('0'), ...right];
  return groups.slice(0, 4).map((g) => (parseInt(g, 16) || 0).toString(16)).join(':');
}
/** Dead peers are found by TCP keepalive, so that what they hold does not stay held. */
const KEEPALIVE_MS = 30_000;
/** How long a refused connection may stay half-open for its `ERR` line to reach the client. */
export const LINGER_MS = 2_000;

/**
 * Slots for connections that still owe their handshake: MAX_HANDSHAKES in all and, once half are
 * taken, MAX_HANDSHAKES_PER_ADDRESS per client network (the rule above). The stream gateway keeps
 * a second set for request heads still being read.
 */
export class HandshakeSlots {
  private taken = 0;
  private readonly byNetwork = new Map<string, number>();

  /** Takes a slot for a connection from `address`; false when it may not have one. */
  take(address: string): boolean {
    const network = clientNetwork(address);
    const fromNetwork = this.byNetwork.get(network) ?? 0;
    if (this.taken >= MAX_HANDSHAKES || (fromNetwork >= MAX_HANDSHAKES_PER_ADDRESS && this.taken >= FAIR_SHARE_FROM)) return false;
    this.taken++;
    this.byNetwork.set(network, fromNetwork + 1);
    return true;
  }

  /** Gives back a slot `take` gave for `address`. */
  give(address: string): void {
    const network = clientNetwork(address);
    this.taken--;
    const left = (this.byNetwork.get(network) ?? 1) - 1;
    if (left > 0) this.byNetwork.set(network, left);
    else this.byNetwork.delete(network);
  }
}

export class LineListener {
  /** Every open client connection, whatever its state. */
  private readonly sockets = new Set<Socket>();
  private readonly handshakes = new HandshakeSlots();
  private closingFlag = false;

  private constructor(
    private readonly server: Server,
    private readonly options: LineListenerOptions,
    readonly port: number,
  ) {
    server.on('connection', (socket) => this.accept(socket));
  }

  static async start(options: LineListenerOptions): Promise<LineListener> {
    const server = createServer({
      noDelay: true,
      keepAlive: true,
      keepAliveInitialDelay: KEEPALIVE_MS,
      allowHalfOpen: options.allowHalfOpen ?? false,
    });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(options.port, options.listenHost, () => {
        server.off('error', reject);
        resolve();
      });
    });
    // A failing accept must not crash the agent.
    server.on('error', (err) => options.log(`${options.name} error`, { error: String(err) }));
    const address = server.address();
    const port = typeof address === 'object' && address !== null ? address.port : options.port;
    options.log(`${options.name} listening`, { host: options.listenHost, port });
    return new LineListener(server, options, port);
  }

  get closing(): boolean {
    return this.closingFlag;
  }

  /** Stops listening and destroys every connection; resolves once the listener is closed. */
  close(): Promise<void> {
    this.closingFlag = true;
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    for (const socket of this.sockets) socket.destroy();
    return closed;
  }

  private accept(socket: Socket): void {
    socket.on('error', () => undefined);
    const address = socket.remoteAddress ?? '';
    if (this.closingFlag || !this.handshakes.take(address)) {
      socket.destroy();
      return;
    }
    this.sockets.add(socket);
    socket.once('close', () => this.sockets.delete(socket));
    let owing = true;
    const { maxLineBytes, onLine, onNoLine } = this.options;
    let head: Buffer = Buffer.alloc(0);
    const timer = setTimeout(() => {
      done();
      onNoLine(socket, 'timeout');
    }, this.options.handshakeTimeoutMs);
    timer.unref();
    const done = () => {
      clearTimeout(timer);
      socket.off('data', onData);
      socket.off('end', onEnd);
      if (!owing) return;
      owing = false;
      this.handshakes.give(address);
    };
    const onData = (chunk: Buffer) => {
      head = head.length === 0 ? chunk : Buffer.concat([head, chunk]);
      const nl = head.indexOf(0x0a);
      if (nl < 0 && head.length < maxLineBytes) return;
      done();
      // A longer line is not read on.
      if (nl < 0 || nl >= maxLineBytes) {
        onNoLine(socket, 'too_long');
        return;
      }
      // What follows the line is the client's first bytes for the other side: held until it is open.
      socket.pause();
      onLine(socket, head.subarray(0, nl).toString('latin1').replace(/\r$/, ''), head.subarray(nl + 1));
    };
    const onEnd = () => {
      done();
      onNoLine(socket, 'ended');
    };
    socket.on('data', onData);
    socket.once('end', onEnd);
    socket.once('close', done);
  }
}

/** Writes `ERR <code>` and closes; unread input is drained so the line is not lost to a reset. */
export function refuseWithLine(socket: Socket, code: string): void {
  if (socket.destroyed) return;
  socket.end(`ERR ${code}\n`);
  socket.resume();
  const timer = setTimeout(() => socket.destroy(), LINGER_MS);
  timer.unref();
  socket.once('close', () => clearTimeout(timer));
}
