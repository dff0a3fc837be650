/**
 * The port gateway (docs/api.md §4.7): one TCP listener per agent through which the scheduler's ingress
 * reaches TCP ports of apps running inside desktops.
 *
 * The ingress dials the gateway and opens with one signed line naming the desktop, its
 * generation and the guest port (shared/src/port-link.ts). A line that verifies is handed, with
 * its connection, to `handOff` where the driver has port relays: the agent checks the generation,
 * and a relay of its own answers the link and carries it with the agent out of the path
 * (runtime/sandbox/ports/port-relays.ts). Otherwise (and for a client that sent bytes before its
 * answer) it goes to `open` (the same check, then a connection to the port inside the desktop);
 * once that connection stands the gateway answers `OK\n` and from then on only relays bytes both
 * ways, with backpressure, and each side's end reaches the other as a half-close, so a client that
 * finishes sending still gets the whole answer. Anything else gets `ERR <code>\n` and the
 * connection is closed.
 *
 * Only the scheduler holds the join token that signs lines, so the listener may sit on a routable
 * address. Nothing here logs a line (its signature is good for a minute), and every timer is
 * unref'd: the gateway never keeps the agent alive. A failing connection only ever closes itself.
 */
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { PORT_LINK_MAX_LINE, ReplayGuard, verifyPortLink, type PortLinkRefusal, type PortTarget } from '../../../shared/src/port-link.js';
import { AgentFailure } from '../../../shared/src/protocol.js';
import { LineListener, refuseWithLine } from '../line-listener.js';
import type { GuestConnection, HandedOffLink } from '../runtime/driver.js';

export interface PortGatewayOptions {
  /** Address to listen on. */
  readonly listenHost: string;
  /** TCP port; 0 picks a free one (see `port`). */
  readonly port: number;
  /**
   * A connection to the target's port inside its desktop. Rejects with an AgentFailure
   * (`not_running`, `not_found`, `stale_generation`) when the desktop is not running here at that
   * generation, and with an error coded `ECONNREFUSED` when nothing listens on the port.
   */
  readonly open: (target: PortTarget) => Promise<GuestConnection>;
  /**
   * Hands the client to a relay of its own into the target's port, which answers the link itself
   * (RuntimeDriver.handOffGuestPort); null when there is none, and the gateway relays through
   * `open`. Rejects as `open` does, the client still the gateway's. Absent: always `open`.
   */
  readonly handOff?: (target: PortTarget, client: Socket) => Promise<HandedOffLink | null>;
  /** How long a client has to send its line. Default 10 000 ms. */
  readonly handshakeTimeoutMs?: number;
  readonly log: (msg: string, fields?: object) => void;
}

const DEFAULT_HANDSHAKE_MS = 10_000;

/** AgentFailure codes that mean the desktop is not running here at the signed generation. */
const GONE = new Set(['not_running', 'not_found', 'stale_generation']);

/** What a failed `open` is reported as. */
export function refusalFor(err: unknown): Exclude<PortLinkRefusal, 'unauthorized'> {
  if (err instanceof AgentFailure) return GONE.has(err.code) ? 'not_running' : 'unavailable';
  return (err as NodeJS.ErrnoException | null)?.code === 'ECONNREFUSED' ? 'refused' : 'unavailable';
}

/** Port links since the gateway started, by who carries them (its metrics). */
export interface PortLinkStats {
  /** Handed to a relay of their own (the agent out of the path), in all and open now. */
  readonly relayed: number;
  readonly relayedOpen: number;
  /** Relayed by the agent itself, in all and open now. */
  readonly agent: number;
  readonly agentOpen: number;
}

/** A client whose line verified, from then until both its sockets are closed. */
interface Relay {
  readonly client: Socket;
  readonly target: PortTarget;
  readonly since: number;
  guest: GuestConnection | null;
}

export class PortGateway {
  private readonly relays = new Set<Relay>();
  /** The nonces of the lines taken within the skew window. */
  private readonly replays = new ReplayGuard();
  private listener!: LineListener;
  private readonly counts = { relayed: 0, relayedOpen: 0, agent: 0 };
  /** This host's port-link key, from the scheduler's hello reply; until then every line is refused. */
  private key: string | null = null;

  private constructor(private readonly options: PortGatewayOptions) {}

  static async start(options: PortGatewayOptions): Promise<PortGateway> {
    const gateway = new PortGateway(options);
    gateway.listener = await LineListener.start({
      listenHost: options.listenHost,
      port: options.port,
      maxLineBytes: PORT_LINK_MAX_LINE,
      handshakeTimeoutMs: options.handshakeTimeoutMs ?? DEFAULT_HANDSHAKE_MS,
      // A client's end must not end our side too, or the guest's answer is lost.
      allowHalfOpen: true,
      name: 'port gateway',
      log: options.log,
      onLine: (socket, line, early) => void gateway.begin(socket, line, early),
      onNoLine: (socket, why) => gateway.refuse(socket, 'unauthorized', null, `no line (${why})`),
    });
    return gateway;
  }

  get port(): number {
    return this.listener.port;
  }

  stats(): PortLinkStats {
    return { ...this.counts, agentOpen: [...this.relays].filter((r) => r.guest !== null).length };
  }

  /** Sets the key lines must be signed with (the scheduler hands it over in hello). */
  setKey(key: string): void {
    this.key = key;
  }

  /** Stops listening and closes every connection, the guest ends included. */
  async close(): Promise<void> {
    const closed = this.listener.close();
    for (const relay of this.relays) relay.guest?.destroy();
    await closed;
  }

  private async begin(client: Socket, line: string, early: Buffer): Promise<void> {
    if (this.listener.closing) {
      client.destroy();
      return;
    }
    const link = this.key === null ? null : verifyPortLink(this.key, line);
    if (link === null) {
      this.refuse(client, 'unauthorized', null, 'bad line');
      return;
    }
    // A line seen on the network opens nothing more: its nonce is taken once.
    if (!this.replays.take(link)) {
      this.refuse(client, 'unauthorized', null, 'replayed line');
      return;
    }
    const { target } = link;
    // Bytes sent before `OK` (our ingress sends none) are read here already: this relays them.
    if (this.options.handOff !== undefined && early.length === 0 && client.readableLength === 0 && (await this.handOff(client, target))) return;
    const relay: Relay = { client, target, since: performance.now(), guest: null };
    this.relays.add(relay);
    client.once('close', () => this.finish(relay));
    let guest: GuestConnection;
    try {
      guest = await this.options.open(target);
    } catch (err) {
      this.refuse(client, refusalFor(err), target, err);
      return;
    }
    guest.on('error', () => undefined);
    if (client.destroyed || this.listener.closing) {
      // The client left, or the gateway closed, while the port was being opened.
      guest.destroy();
      return;
    }
    relay.guest = guest;
    this.counts.agent++;
    this.relay(relay, guest, early);
  }

  /** Hands the link to a relay of its own (RuntimeDriver.handOffGuestPort); false when there is none. */
  private async handOff(client: Socket, target: PortTarget): Promise<boolean> {
    const since = performance.now();
    const fields = { desktopId: target.desktopId, port: target.port, remote: client.remoteAddress };
    let handed: HandedOffLink | null;
    try {
      handed = await this.options.handOff!(target, client);
    } catch (err) {
      this.refuse(client, refusalFor(err), target, err);
      return true;
    }
    if (handed === null) return false;
    this.counts.relayed++;
    this.counts.relayedOpen++;
    this.options.log('port connection handed off', { ...fields, ms: Math.round(performance.now() - since) });
    void handed.outcome.then((outcome) => {
      this.counts.relayedOpen--;
      if (outcome === 'relayed') this.options.log('port connection closed', { ...fields, durationMs: Math.round(performance.now() - since) });
      else this.options.log('port connection refused', { ...fields, code: outcome, reason: 'answered by its relay' });
    });
    return true;
  }

  /**
   * Client → guest and guest → client, each chunk written on as it is read (a `pipe` does the
   * same with more bookkeeping per chunk, measurable on a request of a few hundred bytes), with
   * backpressure, and each side's end passed on as the other's half-close. Both sockets are
   * half-open capable, so each closes by itself
   * once both its directions have ended. A side that closes otherwise (an error, a reset, the
   * desktop stopping) takes the other with it at once; after a clean close the other is left to
   * flush its last bytes.
   */
  private relay(relay: Relay, guest: GuestConnection, early: Buffer): void {
    const { client, target } = relay;
    this.options.log('port connection opened', {
      desktopId: target.desktopId, port: target.port, remote: client.remoteAddress, ms: Math.round(performance.now() - relay.since),
    });
    // A reset, so that a client reading to the end of the stream cannot take a cut-off answer
    // for a whole one.
    guest.once('close', () => {
      if (!(client.writableEnded && client.readableEnded)) client.resetAndDestroy();
    });
    client.once('close', () => {
      if (!(guest.writableEnded && guest.readableEnded)) guest.destroy();
    });
    client.write('OK\n');
    if (early.length > 0) guest.write(early);
    forward(guest, client);
    forward(client, guest);
  }

  /** Logs the refusal (never the line) and answers it with `ERR <code>`. */
  private refuse(socket: Socket, code: PortLinkRefusal, target: PortTarget | null, why: unknown): void {
    this.options.log('port connection refused', {
      code, remote: socket.remoteAddress, desktopId: target?.desktopId, port: target?.port,
      reason: why instanceof Error ? why.message : String(why),
    });
    refuseWithLine(socket, code);
  }

  private finish(relay: Relay): void {
    if (!this.relays.delete(relay) || relay.guest === null) return;
    this.options.log('port connection closed', {
      desktopId: relay.target.desktopId, port: relay.target.port,
      bytesIn: relay.client.bytesRead, bytesOut: relay.client.bytesWritten,
      durationMs: Math.round(performance.now() - relay.since),
    });
  }
}

/** Writes what `from` reads to `to`, pausing while `to` is full; `from`'s end becomes `to`'s half-close. */
function forward(from: Duplex, to: Duplex): void {
  const resume = () => from.resume();
  from.on('data', (chunk: Buffer) => {
    if (!to.write(chunk)) {
      from.pause();
      to.once('drain', resume);
    }
  });
  // The client may have ended while its port was being opened (its end was read with its line).
  if (from.readableEnded) to.end();
  else from.once('end', () => to.end());
  // The line listener paused the client to read its line; a `data` listener alone does not resume it.
  from.resume();
}
