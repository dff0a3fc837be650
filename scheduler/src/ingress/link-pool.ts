/**
 * Kept-alive port links to one guest port of one desktop generation, as a reverse proxy keeps
 * its upstream connections: a new link costs a TCP handshake, a signed line and the agent's
 * answer, which measured several times the rest of a proxied request. A request takes an idle
 * link (the one that idled last: the least likely to have been closed by the app meanwhile) or
 * dials a new one, and gives it back once its answer has been read to the end.
 *
 * An idle link is closed after `IDLE_LINK_MS`, shorter than common servers' keep-alive timeouts
 * (2 s and up), so the guest app rarely closes one just as it is reused; a request that meets
 * such a close is sent again (ingress-server.ts). Bytes or an end arriving on an idle link mean
 * the app is done with it: it is dropped at once.
 */
import type { Socket } from 'node:net';
import { IDLE_LINK_MS } from './port-link-client.js';

/** Idle links kept per guest port. */
const MAX_IDLE_LINKS = 32;

export interface Link {
  readonly socket: Socket;
  /** Whether it carried an earlier request (and so may have been closed by the app meanwhile). */
  readonly reused: boolean;
}

interface Idle {
  readonly socket: Socket;
  readonly timer: NodeJS.Timeout;
  readonly drop: () => void;
}

export class LinkPool {
  private readonly idle: Idle[] = [];
  private readonly busy = new Set<Socket>();
  private retired = false;
  /** Links handed to WebSocket upgrades: theirs for good, closed only by `destroy`. */
  private readonly upgraded = new Set<Socket>();

  constructor(private readonly open: () => Promise<Socket>) {}

  /** An idle link, or a new one (rejects with the dial's PortLinkError); only a new one if `fresh`. */
  async acquire(fresh = false): Promise<Link> {
    while (!fresh) {
      const held = this.idle.pop();
      if (held === undefined) break;
      this.unidle(held);
      if (held.socket.destroyed || held.socket.readableEnded) continue;
      this.busy.add(held.socket);
      return { socket: held.socket, reused: true };
    }
    // Retired while dialling, the link still serves this one request; release closes it.
    const socket = await this.open();
    this.busy.add(socket);
    return { socket, reused: false };
  }

  /** Hands back a link whose last answer was read to the end; it idles, or closes if not wanted. */
  release(socket: Socket): void {
    this.busy.delete(socket);
    if (this.retired || socket.destroyed || this.idle.length >= MAX_IDLE_LINKS) return void socket.destroy();
    const drop = () => {
      const at = this.idle.findIndex((i) => i.socket === socket);
      if (at !== -1) this.unidle(this.idle.splice(at, 1)[0]!);
      socket.destroy();
    };
    const timer = setTimeout(drop, IDLE_LINK_MS);
    timer.unref();
    socket.on('data', drop);
    socket.on('end', drop);
    socket.on('close', drop);
    this.idle.push({ socket, timer, drop });
  }

  /** Drops a link that cannot carry another request. */
  discard(socket: Socket): void {
    this.busy.delete(socket);
    socket.destroy();
  }

  /** An agent that dials a fresh link for each WebSocket upgrade (an upgraded link is never reused). */
  /** A link of its own for a WebSocket upgrade (rejects with the dial's PortLinkError). */
  async dial(): Promise<Socket> {
    const socket = await this.open();
    this.upgraded.add(socket);
    socket.once('close', () => this.upgraded.delete(socket));
    return socket;
  }

  /** Closes the idle links; links in use finish their request and then close. */
  retire(): void {
    this.retired = true;
    for (const held of this.idle.splice(0)) {
      this.unidle(held);
      held.socket.destroy();
    }
  }

  /** Closes every link, those in use included. */
  destroy(): void {
    this.retire();
    for (const socket of this.busy) socket.destroy();
    this.busy.clear();
    for (const socket of this.upgraded) socket.destroy();
    this.upgraded.clear();
  }

  /** Idle links, for tests. */
  get idleCount(): number {
    return this.idle.length;
  }

  private unidle(held: Idle): void {
    clearTimeout(held.timer);
    held.socket.off('data', held.drop);
    held.socket.off('end', held.drop);
    held.socket.off('close', held.drop);
  }
}
