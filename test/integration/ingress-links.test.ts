/**
 * The ingress keeps its links to agents alive (ingress/port-link-client.ts): requests to one guest
 * port reuse an idle link whichever client sent them; a link idle for `IDLE_LINK_MS` is closed; a
 * new desktop generation gets new links; and a bodiless request that meets a reused link the app
 * closes under it goes again on a fresh link, while a request with a body is not sent twice.
 * The port gateway here is a stand-in that checks the signed opening line and then serves HTTP
 * itself, numbering its links, so the test sees exactly which link carried what.
 */
import { createServer as createHttpServer, request, type IncomingMessage, type ServerResponse } from 'node:http';
import { createServer as createTcpServer, type Server as TcpServer, type Socket } from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import { portLinkKey, verifyPortLinkLine, type PortTarget } from '../../shared/src/port-link.js';
import { generateSecretKey } from '../../scheduler/src/crypto/secret-box.js';
import { PortIngress } from '../../scheduler/src/ingress/ingress-server.js';
import { IDLE_LINK_MS } from '../../scheduler/src/ingress/port-link-client.js';
import type { PortRoute } from '../../scheduler/src/services/ports.js';
import { createRootLogger } from '../../shared/src/log.js';
import { until } from '../helpers/wait.js';

const SECRET = generateSecretKey();
const HOST_ID = newId('host');
const DOMAIN = 'apps.test';
const PORT = 8000;

/** A port gateway that serves HTTP on each link itself; `handler` answers, knowing the link's number. */
interface StandIn {
  address: string;
  links: number;
  open: Set<Socket>;
  targets: PortTarget[];
  handler: (link: number, req: IncomingMessage, res: ServerResponse) => void;
  close(): Promise<void>;
}

async function startStandIn(): Promise<StandIn> {
  const http = createHttpServer((req, res) => state.handler((req.socket as Socket & { link: number }).link, req, res));
  const state: StandIn = {
    address: '',
    links: 0,
    open: new Set(),
    targets: [],
    handler: (link, req, res) => {
      req.resume();
      req.on('end', () => res.end(JSON.stringify({ link })));
    },
    async close() {
      for (const s of state.open) s.destroy();
      await new Promise((r) => tcp.close(r));
    },
  };
  const key = portLinkKey(SECRET, HOST_ID);
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
      const target = verifyPortLinkLine(key, buffered.subarray(0, newline).toString('latin1'));
      if (!target) return void socket.end('ERR unauthorized\n');
      state.targets.push(target);
      (socket as Socket & { link: number }).link = ++state.links;
      socket.write('OK\n');
      const rest = buffered.subarray(newline + 1);
      if (rest.length > 0) socket.unshift(rest);
      http.emit('connection', socket);
    };
    socket.on('data', onData);
  });
  await new Promise<void>((r) => tcp.listen(0, '127.0.0.1', r));
  state.address = `127.0.0.1:${(tcp.address() as { port: number }).port}`;
  return state;
}

let gateway: StandIn;
let ingress: PortIngress;
let route: PortRoute;
const desktopId = newId('desktop');

beforeAll(async () => {
  gateway = await startStandIn();
  route = {
    id: newId('port'), org_id: newId('org'), desktop_id: desktopId, port: PORT, public: true, token_hash: null,
    created_at: new Date(), desktop_state: 'awake', generation: 3, host_id: HOST_ID, host_status: 'ready',
    ingress_address: gateway.address,
  };
  ingress = await PortIngress.start({
    settings: { scheme: 'http', domain: DOMAIN, urlPort: null, listenHost: '127.0.0.1', listenPort: 0 },
    ports: { route: async (id, port) => (id === desktopId && port === PORT ? { ...route } : null), onChange: () => () => {} },
    portLinkSecret: SECRET,
    logger: createRootLogger({ level: 'silent', name: 'test' }),
  });
});

afterEach(() => {
  gateway.handler = (link, req, res) => {
    req.resume();
    req.on('end', () => res.end(JSON.stringify({ link })));
  };
});

afterAll(async () => {
  await ingress?.close();
  await gateway?.close();
});

/** One request through the ingress on a connection of its own; answers status and body. */
function send(method = 'GET', body?: string): Promise<{ status: number; body: string }> {
  const url = new URL(ingress.url);
  return new Promise((resolve, reject) => {
    const req = request({ host: url.hostname, port: url.port, method, path: '/', agent: false, headers: { host: `${PORT}-${desktopId}.${DOMAIN}` } }, (res) => {
      let text = '';
      res.on('data', (c: Buffer) => (text += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: text }));
    });
    req.on('error', reject);
    req.end(body);
  });
}

const linkOf = (r: { body: string }) => (JSON.parse(r.body) as { link: number }).link;

describe('links from the ingress to a port gateway', () => {
  it('are reused by later requests from other client connections, and closed after idling', async () => {
    const first = await send();
    const second = await send();
    const third = await send();
    expect([first.status, second.status, third.status]).toEqual([200, 200, 200]);
    expect(linkOf(second)).toBe(linkOf(first));
    expect(linkOf(third)).toBe(linkOf(first));
    // Idle for IDLE_LINK_MS: the ingress closes it, and the next request opens another.
    await until(() => gateway.open.size === 0, IDLE_LINK_MS * 5, 'the idle link to close');
    const later = await send();
    expect(linkOf(later)).toBeGreaterThan(linkOf(first));
    expect(gateway.targets.at(-1)).toEqual({ desktopId, generation: 3, port: PORT });
  });

  it('are opened anew for a new generation of the desktop, and the old idle ones closed', async () => {
    const before = linkOf(await send());
    route.generation = 4;
    // The route is cached; a failed attempt or its time limit refreshes it. Drop it as a change would.
    (ingress as unknown as { routes: { forget(d: string, p: number): void } }).routes.forget(desktopId, PORT);
    const after = await send();
    expect(linkOf(after)).toBeGreaterThan(before);
    expect(gateway.targets.at(-1)).toEqual({ desktopId, generation: 4, port: PORT });
    await until(() => gateway.open.size === 1, 5_000, 'the old generation\'s idle link to close');
  });

  it('send a bodiless request again when the app closes the reused link under it, but never one with a body', async () => {
    const warm = linkOf(await send());
    const seen: Array<{ link: number; method: string }> = [];
    // The app drops the reused link as the request arrives, answering nothing; fresh links answer.
    gateway.handler = (link, req, res) => {
      seen.push({ link, method: req.method! });
      if (link === warm) return void req.socket.destroy();
      req.resume();
      req.on('end', () => res.end(JSON.stringify({ link })));
    };
    const retried = await send('GET');
    expect(retried.status).toBe(200);
    expect(linkOf(retried)).toBeGreaterThan(warm);
    expect(seen.map((s) => s.link)).toEqual([warm, linkOf(retried)]);

    const reused = linkOf(await send());
    seen.length = 0;
    gateway.handler = (link, req, res) => {
      seen.push({ link, method: req.method! });
      if (link === reused) return void req.socket.destroy();
      res.end(JSON.stringify({ link }));
    };
    const posted = await send('POST', 'x'.repeat(1000));
    expect(posted.status).toBe(502);
    expect(seen).toEqual([{ link: reused, method: 'POST' }]);
  });
});
