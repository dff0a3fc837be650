/**
 * What the ingress holds open toward each desktop — kept-alive links per guest port, and the
 * exchanges relayed now (an answer still streaming, an upload, a WebSocket) — so that all of it
 * ends once the desktop no longer runs where it was relayed to. Admission cannot see to that: it
 * judges a request as it arrives, and a WebSocket or a long answer goes on for as long as its
 * link does. The agent ends its relays when it stops a desktop, but a desktop's row can change
 * without its agent hearing of it: host health force-hibernates the desktops of a host no
 * scheduler hears from, and under an asymmetric partition the ingress may still reach that host's
 * port gateway, so use of the desktop would go on, unbilled, over connections already open. Every
 * replica hears each change of a desktop's row (services/ports.ts) and ends here what it relays,
 * and the links it keeps, for a host and generation the row no longer runs awake.
 *
 * A request is not counted while it waits (for a link, or through a move): it is judged once its
 * link is open, against the last change heard of its desktop since its route was read, and if
 * that change ended its route it goes the way of a link the host refused (nothing of it was
 * sent). So a move's commit ends the WebSockets open to its source, which end with the source's
 * copy anyway, but not the requests it holds for the target.
 */
import type { Duplex } from 'node:stream';
import { PORT_LINK_V2_MINOR, portLinkKey } from '../../../shared/src/port-link.js';
import { protocolAtLeast } from '../../../shared/src/protocol.js';
import type { DesktopRunning, PortRoute } from '../services/ports.js';
import { LinkPool } from './link-pool.js';
import { dialPortLink, PortLinkError } from './port-link-client.js';

/**
 * Desktops whose last change is remembered, the oldest forgotten first: what a request is judged
 * against between its route's read and its link, milliseconds in which ten thousand other
 * desktops do not change.
 */
const MAX_HEARD = 10_000;

/** Where traffic was relayed to: a host, and the generation it ran there. */
interface RanAt {
  readonly host_id: string | null;
  readonly generation: number;
}

/**
 * Whether traffic relayed to `ran` (awake there) must end, the desktop's row now reading `now`
 * (null: gone). Every change of state bumps the generation (store/desktops.ts `transition`), and
 * generations only grow: a change of an older generation than the one relayed to, heard late,
 * says nothing of it, and a change that keeps state, host and generation (a move's mark, an idle
 * timeout) ends nothing.
 */
export function outlives(now: DesktopRunning | null, ran: RanAt): boolean {
  if (now === null) return true;
  if (now.generation !== ran.generation) return now.generation > ran.generation;
  return now.state !== 'awake' || now.host_id !== ran.host_id;
}

/** What a link opened for a route that a change heard meanwhile ended gets: the host's refusal, in effect. */
export function stoppedThere(): PortLinkError {
  return new PortLinkError('not_running', 'the desktop no longer runs where its route said');
}

interface HeldPool extends RanAt {
  readonly host_id: string;
  readonly address: string;
  /** The port-link line version its links open with (a host upgraded to 1.16 gets new ones). */
  readonly version: 1 | 2;
  readonly pool: LinkPool;
}

interface Relay {
  readonly route: PortRoute;
  readonly sockets: readonly Duplex[];
}

export class DesktopLinks {
  /** Kept-alive links, by desktop and then guest port, for the host and generation they were made for. */
  private readonly pools = new Map<string, Map<number, HeldPool>>();
  /** Exchanges relayed now, by desktop. */
  private readonly relays = new Map<string, Set<Relay>>();
  /** The last change heard of each desktop, and its number in the order heard. */
  private readonly heard = new Map<string, { readonly now: DesktopRunning | null; readonly at: number }>();
  private heardCount = 0;
  /** For each route read, the number of changes heard when its read began. */
  private readonly readAt = new WeakMap<PortRoute, number>();

  constructor(private readonly portLinkSecret: string) {}

  /** `lookup`'s route, marked with when the read began (see `outdated`). */
  async read(lookup: () => Promise<PortRoute | null>): Promise<PortRoute | null> {
    const at = this.heardCount;
    const route = await lookup();
    if (route) this.readAt.set(route, at);
    return route;
  }

  /**
   * Whether a change heard since the route was read ends it. One heard before cannot: the read
   * began after that change committed, and so saw it.
   */
  outdated(route: PortRoute): boolean {
    const change = this.heard.get(route.desktop_id);
    return change !== undefined && change.at > (this.readAt.get(route) ?? 0) && outlives(change.now, route);
  }

  /** The exposure's kept-alive links; new ones when the desktop moved, woke again or changed host. */
  pool(route: PortRoute): LinkPool {
    // A bound route (isBound) has a host and a gateway address.
    const hostId = route.host_id!;
    const address = route.ingress_address!;
    let ports = this.pools.get(route.desktop_id);
    const held = ports?.get(route.port);
    // A line good for one link (`/2`, its nonce taken once) to an agent that takes it.
    const version = protocolAtLeast(route.host_protocol ?? '', 1, PORT_LINK_V2_MINOR) ? 2 : 1;
    if (held && held.host_id === hostId && held.address === address && held.generation === route.generation && held.version === version) return held.pool;
    if (held) held.pool.retire();
    const secret = portLinkKey(this.portLinkSecret, hostId);
    const target = { desktopId: route.desktop_id, generation: route.generation, port: route.port };
    const pool = new LinkPool(() => dialPortLink(secret, address, target, { version }));
    if (!ports) this.pools.set(route.desktop_id, (ports = new Map()));
    ports.set(route.port, { host_id: hostId, address, generation: route.generation, version, pool });
    return pool;
  }

  /** Forgets the exposure's links: idle ones close, and those in use after their exchange, or at once if `now`. */
  drop(desktopId: string, port: number, now: boolean): void {
    const ports = this.pools.get(desktopId);
    const held = ports?.get(port);
    if (!ports || !held) return;
    if (now) held.pool.destroy();
    else held.pool.retire();
    ports.delete(port);
    if (ports.size === 0) this.pools.delete(desktopId);
  }

  /**
   * Counts an exchange relayed to `route` on `sockets` (the client's, the link) until the function
   * it answers is called; they are destroyed if the desktop stops running there first.
   */
  relaying(route: PortRoute, sockets: readonly Duplex[]): () => void {
    const relay: Relay = { route, sockets };
    let relays = this.relays.get(route.desktop_id);
    if (!relays) this.relays.set(route.desktop_id, (relays = new Set()));
    relays.add(relay);
    const held = relays;
    return () => {
      held.delete(relay);
      if (held.size === 0 && this.relays.get(route.desktop_id) === held) this.relays.delete(route.desktop_id);
    };
  }

  /** Hears a change of the desktop's row: ends what is relayed, and the links kept, for what it no longer runs. */
  changed(desktopId: string, now: DesktopRunning | null): void {
    const last = this.heard.get(desktopId)?.now;
    // Read before a change already heard (a check's read, answered late): it tells nothing new.
    if (now !== null && last && now.generation < last.generation) return;
    // Map order is insertion order: re-inserted, the desktop is the newest, and the oldest goes.
    this.heard.delete(desktopId);
    this.heard.set(desktopId, { now, at: ++this.heardCount });
    if (this.heard.size > MAX_HEARD) this.heard.delete(this.heard.keys().next().value!);
    for (const relay of [...(this.relays.get(desktopId) ?? [])]) {
      if (outlives(now, relay.route)) for (const socket of relay.sockets) socket.destroy();
    }
    for (const [port, held] of this.pools.get(desktopId) ?? []) if (outlives(now, held)) this.drop(desktopId, port, true);
  }

  /**
   * Changes may have gone unheard (the listen connection reconnected): each exposure something is
   * relayed to is read again, and its desktop's row as read is taken as a change heard; `gone` is
   * told of an exposure that is no longer there. Rejects with the first read that failed.
   */
  async recheck(lookup: (desktopId: string, port: number) => Promise<PortRoute | null>, gone: (desktopId: string, port: number) => void): Promise<void> {
    const exposures = new Map<string, { desktopId: string; port: number }>();
    for (const [desktopId, relays] of this.relays) {
      for (const { route } of relays) exposures.set(`${desktopId}:${route.port}`, { desktopId, port: route.port });
    }
    await Promise.all(
      [...exposures.values()].map(async ({ desktopId, port }) => {
        const route = await lookup(desktopId, port);
        if (route === null) gone(desktopId, port);
        else this.changed(desktopId, { state: route.desktop_state, host_id: route.host_id, generation: route.generation });
      }),
    );
  }

  /** Closes every link (the client sockets are the server's to close). */
  close(): void {
    for (const ports of this.pools.values()) for (const held of ports.values()) held.pool.destroy();
    this.pools.clear();
    this.relays.clear();
  }
}
