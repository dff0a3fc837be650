/**
 * The port ingress (docs/api.md §4.7): an HTTP server of its own, beside the API, that serves
 * `{port}-{desktop_id}.{domain}`. Each request (and WebSocket upgrade) is admitted in order —
 * the host names an exposure (else 404, the same answer for ever after a delete), the token of a
 * private exposure matches (else 401), the desktop is awake on a host that is up with a port
 * gateway (else 503 with Retry-After) — and is then relayed, streaming both ways, over a port
 * link to that host's agent (port-link-client.ts): plain requests by hand (http-relay.ts), on
 * links kept alive per guest port (link-pool.ts), WebSocket upgrades through the proxy library
 * on a link of their own. The agent's refusals map to statuses
 * here: `not_running` and `unavailable` are 503 (retry), `refused` is 502 (nothing listens in the
 * guest), anything else 502. A request without a body that fails on a reused link, before any
 * answer, is sent once more on a fresh one. A link refused because the host no longer runs the
 * desktop (a cached route from before a move or a wake) is tried once more on the route read
 * afresh, whatever the request carries: nothing of it was sent. While a move of the desktop is
 * open, such a request waits for the desktop to run on its target (up to `moveHoldMs`) instead
 * of answering 503, WebSocket upgrades included.
 *
 * The ingress reads exposures, desktops and hosts from PostgreSQL and dials agents directly, so
 * it works on every replica, not only on the leader that holds the agent links. What it relays to
 * a desktop ends once any replica changes the desktop's row so it no longer runs there (desktop-links.ts).
 */
import { setTimeout as delay } from 'node:timers/promises';
import { createServer, type ClientRequest, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { ProxyServer } from 'http-proxy-3';
import type { Logger } from '../../../shared/src/log.js';
import type { IngressSettings } from '../config.js';
import { ApiError, errors, problem } from '../errors.js';
import { isBound, type DesktopListener, type DesktopRunning, type PortRoute } from '../services/ports.js';
import { parseExposureHost } from '../services/exposure-host.js';
import { PortLinkAgent, PortLinkError } from './port-link-client.js';
import { DesktopLinks, stoppedThere } from './desktop-links.js';
import { hasBody, relay, requestHead } from './http-relay.js';
import { hostOnlyCookie } from './response-reader.js';
import { anyTokenMatches, presentedTokens, stripToken } from './port-token.js';
import { keyOf, RouteCache } from './route-cache.js';
import { answerClientError, answerRaw, answerUnroutable, MISSING_HOST } from '../http/client-errors.js';
import { formatHost } from '../../../shared/src/host-port.js';

/** What the ingress needs from the port service. */
export interface IngressPorts {
  route(desktopId: string, port: number): Promise<PortRoute | null>;
  onChange(listener: (desktopId: string, port: number) => void): () => void;
  onDesktopChange(listener: DesktopListener): () => void;
}

export interface IngressDeps {
  settings: IngressSettings;
  ports: IngressPorts;
  /** The schedulers' secret key: each host's port-link key derives from it (portLinkKey). */
  portLinkSecret: string;
  logger: Logger;
}

/** The proxy needs a target URL; the connection itself always comes from the port link agent. */
const LINK_TARGET = new URL('http://port-link.invalid');
/** How long a client may take to send request headers. Bodies have no deadline: they stream. */
const HEADERS_TIMEOUT_MS = 60_000;
/** What a request may still try after its links are refused (PortIngress.routeAfterRefusal). */
interface RetryBudget {
  readonly holdUntil: number;
  /** Whether it has already followed a route that moved on without a move open. */
  followed: boolean;
}

/** How often a request held through a move asks whether the desktop runs again. */
const MOVE_POLL_MS = 50;

export class PortIngress {
  private readonly log: Logger;
  private readonly routes: RouteCache;
  /** For WebSocket upgrades only: plain requests are relayed by http-relay.ts. */
  private readonly proxy = new ProxyServer({ xfwd: true, ws: true });
  /** Client sockets carrying traffic of an exposure, closed when the exposure is deleted. */
  private readonly open = new Map<string, Set<Duplex>>();
  /**
   * When each exposure last changed (a sequence number of this replica's), so a request whose
   * admission raced a delete is admitted again instead of being held by a socket the delete's
   * sweep of `open` came too early for. Bounded: the oldest entries go first.
   */
  private readonly changedAt = new Map<string, number>();
  private changes = 0;
  /** Every client socket, including upgraded ones the HTTP server no longer tracks. */
  private readonly sockets = new Set<Duplex>();
  private readonly unsubscribe: () => void;
  /** Kept-alive links per exposure, and what is relayed now, ended when its desktop stops running there. */
  private readonly desktops: DesktopLinks;
  /** Route reads in flight for requests held through a move, by exposure. */
  private readonly reading = new Map<string, Promise<PortRoute | null>>();

  private constructor(
    private readonly deps: IngressDeps,
    private readonly server: Server,
  ) {
    this.log = deps.logger.child({ component: 'ingress' });
    this.desktops = new DesktopLinks(deps.portLinkSecret);
    this.routes = new RouteCache((desktopId, port) => this.desktops.read(() => deps.ports.route(desktopId, port)));
    const exposures = deps.ports.onChange((desktopId, port) => this.exposureChanged(desktopId, port));
    const desktops = deps.ports.onDesktopChange((desktopId, now) => this.desktopChanged(desktopId, now));
    this.unsubscribe = () => {
      exposures();
      desktops();
    };
    // Errors are handled per call; this only keeps a stray one from being thrown.
    this.proxy.on('error', (err) => this.log.debug({ err }, 'proxy error'));
    // An upgrade's answer (101 or not) keeps its cookies on the exposure too: these listeners
    // run before the library's own, which writes the headers to the client.
    this.proxy.on('proxyReqWs', (proxyReq: ClientRequest) => {
      const hostOnly = (res: IncomingMessage) => {
        const cookies = res.headers['set-cookie'];
        if (cookies) res.headers['set-cookie'] = cookies.map(hostOnlyCookie);
      };
      proxyReq.prependListener('upgrade', hostOnly);
      proxyReq.prependListener('response', hostOnly);
    });
  }

  static async start(deps: IngressDeps): Promise<PortIngress> {
    const server = createServer({ requestTimeout: 0, headersTimeout: HEADERS_TIMEOUT_MS, requireHostHeader: false });
    const ingress = new PortIngress(deps, server);
    server.on('connection', (socket: Socket) => ingress.track(socket));
    server.on('clientError', answerClientError);
    answerUnroutable(server);
    server.on('request', (req: IncomingMessage, res: ServerResponse) => {
      ingress.web(req, res).catch((err: unknown) => ingress.answer(res, ingress.asApiError(err)));
    });
    server.on('upgrade', (req: IncomingMessage, socket: Duplex, head: Buffer) => {
      ingress.upgrade(req, socket, head).catch((err: unknown) => rejectUpgrade(socket, ingress.asApiError(err)));
    });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(deps.settings.listenPort, deps.settings.listenHost, () => {
        server.off('error', reject);
        resolve();
      });
    });
    ingress.log.info({ url: ingress.url, domain: deps.settings.domain }, 'port ingress listening');
    return ingress;
  }

  /** Where the ingress listens, e.g. `http://127.0.0.1:8081`. */
  get url(): string {
    const address = this.server.address();
    const port = typeof address === 'object' && address ? address.port : this.deps.settings.listenPort;
    const host = this.deps.settings.listenHost;
    const shown = host === '0.0.0.0' || host === '::' || host === '' ? '127.0.0.1' : formatHost(host);
    return `http://${shown}:${port}`;
  }

  async close(): Promise<void> {
    this.unsubscribe();
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    for (const socket of this.sockets) socket.destroy();
    this.server.closeAllConnections();
    await closed;
    this.routes.clear();
    this.desktops.close();
  }

  private async web(req: IncomingMessage, res: ServerResponse): Promise<void> {
    let route: PortRoute;
    try {
      route = await this.admitCurrent(req);
    } catch (err) {
      return this.answer(res, this.asApiError(err));
    }
    this.hold(route, req.socket);
    const head = requestHead(req);
    const connection = req.headers.connection;
    let pool = this.desktops.pool(route);
    const retry = this.retryBudget();
    for (let attempt = 0; ; attempt++) {
      let link;
      try {
        // A retry goes on a new link: another idle one may have been closed by the app just as well.
        link = await pool.acquire(attempt > 0);
        if (this.desktops.outdated(route)) {
          pool.discard(link.socket);
          throw stoppedThere();
        }
      } catch (err) {
        const next = await this.routeAfterRefusal(err, route, retry);
        if (res.destroyed) return;
        if (next === null) return this.failed(res, err, route);
        // Nothing of the request was sent: it goes where the desktop runs now, body and all.
        route = next;
        attempt = -1;
        pool = this.desktops.pool(route);
        continue;
      }
      if (res.destroyed) return pool.discard(link.socket);
      const relayed = this.desktops.relaying(route, [req.socket, link.socket]);
      const result = await relay(req, res, link.socket, head, connection);
      relayed();
      if (result.kind === 'done') {
        if (result.reusable) pool.release(link.socket);
        else pool.discard(link.socket);
        return;
      }
      pool.discard(link.socket);
      // A kept-alive link the guest app closed as it was reused: nothing reached the app's
      // handler, and a request without a body can go again as it came.
      if (attempt === 0 && link.reused && !res.headersSent && !hasBody(req) && !req.socket.destroyed) continue;
      return this.failed(res, result.error, route);
    }
  }

  /**
   * Where to try again after a link was refused because the host does not run the desktop; null
   * to answer the refusal. While a move of the desktop is open (stopped on its source, copied,
   * started on its target) the request waits, asking again every MOVE_POLL_MS, until the move
   * lets it through or `holdUntil` passes: a move is then a pause to the app's users, not an
   * error. Otherwise the route is read afresh once, as one cached before a move or a wake names
   * the old host or generation for up to ROUTE_CACHE_TTL_MS. An unreachable host is not asked
   * about again: through an outage, every request would cost the database a second read.
   */
  private async routeAfterRefusal(err: unknown, route: PortRoute, retry: RetryBudget): Promise<PortRoute | null> {
    if (!(err instanceof PortLinkError) || err.reason !== 'not_running') return null;
    const fresh = await this.freshRoute(route.desktop_id, route.port).catch(() => null);
    if (!fresh || !isBound(fresh)) return null;
    if (fresh.moving && Date.now() < retry.holdUntil) {
      await delay(MOVE_POLL_MS);
      return fresh;
    }
    const same = fresh.host_id === route.host_id && fresh.generation === route.generation && fresh.ingress_address === route.ingress_address;
    if (retry.followed || same) return null;
    retry.followed = true;
    return fresh;
  }

  /** What one request may still try after refusals: wait out a move until `holdUntil`, follow a moved route once. */
  private retryBudget(): RetryBudget {
    return { holdUntil: Date.now() + this.deps.settings.moveHoldMs, followed: false };
  }

  /** The route read from the database, one read at a time per exposure however many requests wait. */
  private freshRoute(desktopId: string, port: number): Promise<PortRoute | null> {
    const key = keyOf(desktopId, port);
    let reading = this.reading.get(key);
    if (reading === undefined) {
      this.routes.forget(desktopId, port);
      reading = this.routes.get(desktopId, port).finally(() => this.reading.delete(key));
      this.reading.set(key, reading);
    }
    return reading;
  }

  /** Answers a request whose link failed, or cuts its answer off if it had begun. */
  private failed(res: ServerResponse, err: unknown, route: PortRoute): void {
    const failure = this.linkFailure(err, route);
    if (res.headersSent) res.destroy();
    else this.answer(res, failure);
  }

  private async upgrade(req: IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    let route: PortRoute;
    try {
      route = await this.admitCurrent(req);
    } catch (err) {
      return rejectUpgrade(socket, this.asApiError(err));
    }
    this.hold(route, socket);
    // The link is opened here, before the proxy has the upgrade: a refusal can then wait out a
    // move and go again, as for plain requests (the proxy ends the client's socket on any error).
    const retry = this.retryBudget();
    let link: Socket;
    for (;;) {
      try {
        link = await this.desktops.pool(route).dial();
        if (!this.desktops.outdated(route)) break;
        link.destroy();
        throw stoppedThere();
      } catch (err) {
        const next = await this.routeAfterRefusal(err, route, retry);
        if (socket.destroyed) return;
        if (next === null) return rejectUpgrade(socket, this.linkFailure(err, route));
        route = next;
      }
    }
    if (socket.destroyed) return void link.destroy();
    socket.once('close', this.desktops.relaying(route, [socket, link]));
    const failed = route;
    this.proxy.ws(req, socket, head, { target: LINK_TARGET, agent: new PortLinkAgent(async () => link) }, (err) => {
      const failure = this.linkFailure(err, failed);
      // Before the 101 nothing has been written, and the client can still be told why.
      if ((socket as Socket).bytesWritten === 0) rejectUpgrade(socket, failure);
      else socket.destroy();
    });
  }

  /** `admit`, again if the exposure changed while it ran (a delete's sweep missed this request). */
  private async admitCurrent(req: IncomingMessage): Promise<PortRoute> {
    for (let tries = 0; ; tries++) {
      const before = this.changes;
      const route = await this.admit(req);
      if (tries > 0 || (this.changedAt.get(keyOf(route.desktop_id, route.port)) ?? 0) <= before) return route;
    }
  }

  /** The exposure the request may reach, or the ApiError that answers it. */
  private async admit(req: IncomingMessage): Promise<PortRoute> {
    if (req.headers.host === undefined && req.httpVersion === '1.1') throw errors.badRequest(MISSING_HOST);
    const target = parseExposureHost(this.deps.settings, req.headers.host);
    if (!target) throw errors.ingressNotFound();
    const route = await this.routes.get(target.desktopId, target.port);
    if (!route || route.desktop_state === 'destroyed') throw errors.ingressNotFound();
    if (!route.public && !anyTokenMatches(presentedTokens(req), route.token_hash)) throw errors.ingressUnauthorized();
    if (!isBound(route)) throw errors.portUnbound();
    stripToken(req);
    return route;
  }

  /** The answer for a failed proxy attempt; the cached route and idle links are dropped, they may be stale. */
  private linkFailure(err: unknown, route: PortRoute): ApiError {
    this.routes.forget(route.desktop_id, route.port);
    this.desktops.drop(route.desktop_id, route.port, false);
    if (err instanceof PortLinkError) {
      this.log.info({ desktopId: route.desktop_id, port: route.port, reason: err.reason, message: err.message }, 'port link failed');
      switch (err.reason) {
        case 'not_running':
        case 'unavailable':
        // docs/api.md §4: an unreachable host is 503 (retryable), even before the scheduler marks it down.
        case 'unreachable':
          return errors.portUnbound();
        case 'refused':
          return errors.portRefused();
        default:
          return errors.portLinkFailed();
      }
    }
    this.log.info({ desktopId: route.desktop_id, port: route.port, err }, 'proxying to the guest port failed');
    return errors.portLinkFailed();
  }

  private asApiError(err: unknown): ApiError {
    if (err instanceof ApiError) return err;
    this.log.error({ err }, 'ingress request failed');
    return new ApiError(500, 'internal error');
  }

  private answer(res: ServerResponse, err: ApiError): void {
    if (res.headersSent) return void res.destroy();
    const body = JSON.stringify(problem(err.status, err.detail));
    res.writeHead(err.status, { ...err.headers, 'content-type': 'application/problem+json', 'content-length': Buffer.byteLength(body) });
    res.end(body);
  }

  private track(socket: Duplex): void {
    this.sockets.add(socket);
    socket.once('close', () => this.sockets.delete(socket));
  }

  /** Remembers that `socket` carries the exposure's traffic, until it closes. */
  private hold(route: PortRoute, socket: Duplex): void {
    const key = keyOf(route.desktop_id, route.port);
    let held = this.open.get(key);
    if (!held) this.open.set(key, (held = new Set()));
    if (held.has(socket)) return;
    held.add(socket);
    socket.once('close', () => {
      held.delete(socket);
      if (held.size === 0 && this.open.get(key) === held) this.open.delete(key);
    });
  }

  /** An exposure was created or deleted here: forget its route, and close what it carried. */
  private exposureChanged(desktopId: string, port: number): void {
    this.routes.forget(desktopId, port);
    const key = keyOf(desktopId, port);
    this.changedAt.delete(key);
    this.changedAt.set(key, ++this.changes);
    if (this.changedAt.size > MAX_CHANGES_KEPT) this.changedAt.delete(this.changedAt.keys().next().value!);
    this.desktops.drop(desktopId, port, true);
    for (const socket of this.open.get(key) ?? []) socket.destroy();
    this.open.delete(key);
  }

  /** A desktop's row changed (desktop-links.ts ends what it no longer runs), or with `desktopId` null, any may have. */
  private desktopChanged(desktopId: string | null, now: DesktopRunning | null): void {
    if (desktopId !== null) {
      this.routes.forgetDesktop(desktopId);
      return this.desktops.changed(desktopId, now);
    }
    this.routes.clear();
    this.desktops.recheck((id, port) => this.deps.ports.route(id, port), (id, port) => this.exposureChanged(id, port)).catch((err: unknown) => {
      // What could not be read stays as it is, until the next change heard of it or the next reconnect.
      this.log.warn({ err }, 'could not check what the ingress relays against the database');
    });
  }
}

/** Exposures whose last change is remembered (see `changedAt`). */
const MAX_CHANGES_KEPT = 10_000;

/** Answers an upgrade request that will not be proxied, on its raw socket. */
function rejectUpgrade(socket: Duplex, err: ApiError): void {
  answerRaw(socket, err.status, err.detail, err.headers);
}
