/**
 * A stand-in for an agent's port gateway, for tests of the scheduler's ingress: it checks each
 * link's opening line as the real gateway does (shared/src/port-link.ts), numbers the links, and
 * then serves HTTP on the link itself (`handler`), or hands the link's bytes to `raw` when a test
 * plays a non-HTTP app. `oneRouteIngress` starts an ingress that knows exactly one port route,
 * and hears of its desktop's changes from the test.
 */
import { createServer as createHttpServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { createServer as createTcpServer, type Server as TcpServer, type Socket } from 'node:net';
import { portLinkKey, verifyPortLink, type PortTarget } from '../../shared/src/port-link.js';
import { createRootLogger } from '../../shared/src/log.js';
import { PortIngress } from '../../scheduler/src/ingress/ingress-server.js';
import type { DesktopListener, DesktopRunning, PortRoute } from '../../scheduler/src/services/ports.js';

/** A link's socket, with the number the stand-in gave it. */
export type Linked = Socket & { link: number };
/** What the app does with a request, knowing which link carried it. */
export type LinkHandler = (link: number, req: IncomingMessage, res: ServerResponse) => void;

export interface StandInGateway {
  /** `host:port` the ingress dials. */
  readonly address: string;
  /** Links accepted so far. */
  readonly links: number;
  /** Links open now. */
  readonly open: Set<Socket>;
  /** What each accepted link asked for, in order. */
  readonly targets: PortTarget[];
  /** Each accepted link's line version (`CANTO-PORT/1` or `/2`), in order. */
  readonly versions: string[];
  handler: LinkHandler;
  /** When set, a link's bytes go here instead of to the HTTP app. */
  raw: ((socket: Linked) => void) | null;
  /** When set, a link to a target it answers false for is refused as the gateway does (`ERR not_running`). */
  runs: ((target: PortTarget) => boolean) | null;
  close(): Promise<void>;
}

export async function startStandInGateway(secret: string, hostId: string, handler: LinkHandler): Promise<StandInGateway> {
  const http = createHttpServer((req, res) => state.handler((req.socket as Linked).link, req, res));
  const key = portLinkKey(secret, hostId);
  let links = 0;
  const tcp: TcpServer = createTcpServer((socket) => {
    state.open.add(socket);
    socket.on('close', () => state.open.delete(socket));
    socket.on('error', () => {});
    let buffered = Buffer.alloc(0);
    const onData = (chunk: Buffer) => {
      buffered = Buffer.concat([buffered, chunk]);
      const newline = buffered.indexOf(0x0a);
      if (newline < 0) return;
      socket.off('data', onData);
      const line = buffered.subarray(0, newline).toString('latin1');
      const target = verifyPortLink(key, line)?.target ?? null;
      if (!target) return void socket.end('ERR unauthorized\n');
      if (state.runs && !state.runs(target)) return void socket.end('ERR not_running\n');
      state.targets.push(target);
      state.versions.push(line.split(' ', 1)[0]!);
      (socket as Linked).link = ++links;
      socket.write('OK\n');
      const rest = buffered.subarray(newline + 1);
      if (rest.length > 0) socket.unshift(rest);
      if (state.raw) state.raw(socket as Linked);
      else http.emit('connection', socket);
    };
    socket.on('data', onData);
  });
  await new Promise<void>((resolve) => tcp.listen(0, '127.0.0.1', resolve));
  const state: StandInGateway = {
    address: `127.0.0.1:${(tcp.address() as { port: number }).port}`,
    get links() {
      return links;
    },
    open: new Set(),
    targets: [],
    versions: [],
    handler,
    raw: null,
    runs: null,
    async close() {
      for (const s of state.open) s.destroy();
      await new Promise((resolve) => tcp.close(resolve));
    },
  };
  return state;
}

/** What an ingress hears of desktop rows, told by the test as another replica's change would be. */
export interface DesktopNotes {
  readonly listeners: Set<DesktopListener>;
  /** A desktop's row as a change left it (null: gone); with `desktopId` null, that notifications were lost. */
  tell(desktopId: string | null, now: DesktopRunning | null): void;
}

export function desktopNotes(): DesktopNotes {
  const listeners = new Set<DesktopListener>();
  return { listeners, tell: (desktopId, now) => listeners.forEach((listener) => listener(desktopId, now)) };
}

/**
 * An ingress on a loopback port of its own that knows one route; each lookup answers a copy of
 * `route` as it is then, so a test may change it (a new generation, a move under way), and
 * `notes` tells it of desktop changes.
 */
export function oneRouteIngress(route: PortRoute, secret: string, domain: string, moveHoldMs = 10_000, notes = desktopNotes()): Promise<PortIngress> {
  return PortIngress.start({
    settings: { scheme: 'http', domain, urlPort: null, listenHost: '127.0.0.1', listenPort: 0, moveHoldMs },
    ports: {
      route: async (id, port) => (id === route.desktop_id && port === route.port ? { ...route } : null),
      onChange: () => () => {},
      onDesktopChange: (listener) => {
        notes.listeners.add(listener);
        return () => notes.listeners.delete(listener);
      },
    },
    portLinkSecret: secret,
    logger: createRootLogger({ level: 'silent', name: 'test' }),
  });
}
