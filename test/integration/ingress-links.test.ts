/**
 * The ingress keeps its links to agents alive (ingress/port-link-client.ts): requests to one guest
 * port reuse an idle link whichever client sent them; a link idle for `IDLE_LINK_MS` is closed; a
 * new desktop generation gets new links, and a request that meets a route cached from before the
 * desktop moved on follows it; and a bodiless request that meets a reused link the app closes
 * under it goes again on a fresh link, while a request with a body is not sent twice. While a move
 * of the desktop is open, a refused request (or WebSocket upgrade) waits for the desktop to run on its target.
 * A change of the desktop heard (as from another replica) ends what was relayed to a host and
 * generation it no longer runs: a move's commit ends a WebSocket to its source but not the requests
 * it holds, and a request whose link opens just after a force-hibernate is heard is refused.
 * The port gateway here is a stand-in that checks the signed opening line and then serves HTTP
 * itself, numbering its links, so the test sees exactly which link carried what.
 */
import { PROTOCOL_VERSION } from '../../shared/src/protocol.js';
import { createServer, request } from 'node:http';
import WebSocket, { WebSocketServer } from 'ws';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import { generateSecretKey } from '../../scheduler/src/crypto/secret-box.js';
import type { PortIngress } from '../../scheduler/src/ingress/ingress-server.js';
import { IDLE_LINK_MS } from '../../scheduler/src/ingress/port-link-client.js';
import type { PortRoute } from '../../scheduler/src/services/ports.js';
import { desktopNotes, oneRouteIngress, startStandInGateway, type LinkHandler, type Linked, type StandInGateway } from '../helpers/port-gateway-stand-in.js';
import { until } from '../helpers/wait.js';

const SECRET = generateSecretKey();
const HOST_ID = newId('host');
const DOMAIN = 'apps.test';
const PORT = 8000;

/** The app's default: answers the number of the link that carried the request. */
const answerLink: LinkHandler = (link, req, res) => {
  req.resume();
  req.on('end', () => res.end(JSON.stringify({ link })));
};

let gateway: StandInGateway;
let ingress: PortIngress;
let route: PortRoute;
const desktopId = newId('desktop');
/** Desktop changes as the ingress hears them (another replica's, or host health's). */
const notes = desktopNotes();

beforeAll(async () => {
  gateway = await startStandInGateway(SECRET, HOST_ID, answerLink);
  route = {
    id: newId('port'), org_id: newId('org'), desktop_id: desktopId, port: PORT, public: true, token_hash: null,
    created_at: new Date(), desktop_state: 'awake', generation: 3, host_id: HOST_ID, host_status: 'ready',
    ingress_address: gateway.address, moving: false, host_protocol: PROTOCOL_VERSION,
  };
  ingress = await oneRouteIngress(route, SECRET, DOMAIN, 10_000, notes);
});

afterEach(() => {
  gateway.handler = answerLink;
  gateway.runs = null;
  gateway.raw = null;
  route.moving = false;
});

afterAll(async () => {
  await ingress?.close();
  await gateway?.close();
});

/** One request through the ingress on a connection of its own; answers status and body. */
function send(method = 'GET', body?: string, through: PortIngress = ingress): Promise<{ status: number; body: string }> {
  const url = new URL(through.url);
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

/** Links a gateway accepts go to an app that answers HTTP as `answerLink` and echoes WebSocket messages. */
function serveWebSockets(on: StandInGateway): () => void {
  const wss = new WebSocketServer({ noServer: true });
  const app = createServer((req, res) => answerLink((req.socket as Linked).link, req, res));
  app.on('upgrade', (req, socket, head) => wss.handleUpgrade(req, socket, head, (ws) => ws.on('message', (m) => ws.send(m.toString()))));
  on.raw = (socket) => app.emit('connection', socket);
  return () => wss.close();
}

/** A WebSocket through the ingress: open, or the status it was refused with. */
function upgrade(): Promise<{ ws: WebSocket; closed: Promise<boolean> } | number> {
  const ws = new WebSocket(`ws://127.0.0.1:${new URL(ingress.url).port}/`, { headers: { host: `${PORT}-${desktopId}.${DOMAIN}` } });
  const closed = new Promise<boolean>((resolve) => {
    ws.once('close', () => resolve(true));
    setTimeout(() => resolve(false), 5_000).unref();
  });
  return new Promise((resolve, reject) => {
    ws.once('open', () => resolve({ ws, closed }));
    ws.once('unexpected-response', (_req, res) => resolve(res.resume().statusCode ?? 0));
    ws.once('error', reject);
  });
}

async function echoed(ws: WebSocket, message: string): Promise<string> {
  const answer = new Promise<string>((resolve) => ws.once('message', (m) => resolve(m.toString())));
  ws.send(message);
  return answer;
}

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

  it('follow the desktop when a cached route names a generation its host no longer runs, body and all', async () => {
    // Cached, and a link kept alive, for the current generation.
    expect((await send()).status).toBe(200);
    for (const method of ['GET', 'POST']) {
      // The desktop moved on (a move, a wake) and the host runs only the new generation now; the
      // ingress still holds the old route for up to two seconds. The old generation's links are
      // gone with it (here: closed as idle, so the request needs a new one).
      await until(() => gateway.open.size === 0, IDLE_LINK_MS * 5, 'the idle link to close');
      route.generation += 1;
      const now = route.generation;
      gateway.runs = (target) => target.generation === now;
      const answer = await send(method, method === 'POST' ? 'a body' : undefined);
      expect(answer.status, `${method}: ${answer.body}`).toBe(200);
      expect(gateway.targets.at(-1)).toEqual({ desktopId, generation: now, port: PORT });
    }
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

  it('hold requests while a move of the desktop is open, and send them to its target once it runs there', async () => {
    const before = route.generation;
    // Stopped on its source: the host refuses links to it; a move is open.
    route.moving = true;
    gateway.runs = () => false;
    const t0 = Date.now();
    const held = [send('GET'), send('POST', 'a body')];
    await new Promise((resolve) => setTimeout(resolve, 200));
    // Committed: the route names the target's generation, which does not run yet.
    route.generation = before + 1;
    await new Promise((resolve) => setTimeout(resolve, 200));
    // Started on the target.
    gateway.runs = (target) => target.generation === before + 1;
    route.moving = false;
    const answers = await Promise.all(held);
    expect(answers.map((a) => a.status)).toEqual([200, 200]);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(400);
    expect(gateway.targets.at(-1)).toEqual({ desktopId, generation: before + 1, port: PORT });
  });

  it('hold a WebSocket upgrade through a move too, and open it on the target', async () => {
    // The app: a WebSocket echo on the links it is handed.
    const wss = new WebSocketServer({ noServer: true });
    const app = createServer();
    app.on('upgrade', (req, socket, head) => wss.handleUpgrade(req, socket, head, (ws) => ws.on('message', (m) => ws.send(m.toString()))));
    gateway.raw = (socket) => app.emit('connection', socket);
    try {
      const before = route.generation;
      route.moving = true;
      gateway.runs = () => false;
      const client = new WebSocket(`ws://127.0.0.1:${new URL(ingress.url).port}/`, { headers: { host: `${PORT}-${desktopId}.${DOMAIN}` } });
      const opened = new Promise<void>((resolve, reject) => {
        client.once('open', () => resolve());
        client.once('unexpected-response', (_req, res) => { let b = ''; res.on('data', (c: Buffer) => (b += c)); res.on('end', () => reject(new Error(`answered ${res.statusCode}: ${b}`))); });
        client.once('error', reject);
      });
      await new Promise((resolve) => setTimeout(resolve, 300));
      route.generation = before + 1;
      gateway.runs = (target) => target.generation === before + 1;
      route.moving = false;
      await opened;
      const echoed = new Promise<string>((resolve) => client.once('message', (m) => resolve(m.toString())));
      client.send('after the move');
      expect(await echoed).toBe('after the move');
      expect(gateway.targets.at(-1)).toEqual({ desktopId, generation: before + 1, port: PORT });
      client.close();
    } finally {
      gateway.raw = null;
      wss.close();
    }
  });

  it("end a WebSocket relayed to a move's source at its commit, and send requests held through the move to the target", async () => {
    const targetHost = newId('host');
    const target = await startStandInGateway(SECRET, targetHost, answerLink);
    const stop = [serveWebSockets(gateway), serveWebSockets(target)];
    const source = { host_id: route.host_id, ingress_address: route.ingress_address };
    try {
      const before = route.generation;
      const opened = await upgrade();
      if (typeof opened === 'number') throw new Error(`upgrade answered ${opened}`);
      // Stopped on its source, whose agent (out of the scheduler's reach) still relays the open link.
      route.moving = true;
      gateway.runs = () => false;
      notes.tell(desktopId, { state: 'awake', host_id: HOST_ID, generation: before });
      const held = send('GET');
      await new Promise((resolve) => setTimeout(resolve, 200));
      expect(await echoed(opened.ws, 'through the move')).toBe('through the move');
      // Committed: the desktop is the target's, in a new generation.
      Object.assign(route, { generation: before + 1, host_id: targetHost, ingress_address: target.address });
      notes.tell(desktopId, { state: 'awake', host_id: targetHost, generation: before + 1 });
      expect(await opened.closed, 'the WebSocket to the source is closed').toBe(true);
      await until(() => gateway.open.size === 0, 5_000, "the source's links to close");
      route.moving = false;
      const answer = await held;
      expect(answer.status, answer.body).toBe(200);
      expect(target.targets.at(-1)).toEqual({ desktopId, generation: before + 1, port: PORT });
    } finally {
      // Moved back, for the tests after this one.
      Object.assign(route, source, { generation: route.generation + 1 });
      notes.tell(desktopId, { state: 'awake', host_id: HOST_ID, generation: route.generation });
      stop.forEach((close) => close());
      await target.close();
    }
  });

  it('refuse an upgrade whose desktop stopped while its link was opening, and check open ones when changes went unheard', async () => {
    const stop = serveWebSockets(gateway);
    try {
      const opened = await upgrade();
      if (typeof opened === 'number') throw new Error(`upgrade answered ${opened}`);
      // Notifications were lost (the listen connection reconnected); the desktop has a new generation since.
      route.generation += 1;
      notes.tell(null, null);
      expect(await opened.closed, 'the WebSocket to the old generation is closed').toBe(true);
      // Force-hibernated, heard after the request read its route, before its link answered.
      const hibernateAsLinked = () => {
        Object.assign(route, { desktop_state: 'hibernated', generation: route.generation + 1 });
        notes.tell(desktopId, { state: 'hibernated', host_id: HOST_ID, generation: route.generation });
        return true;
      };
      gateway.runs = hibernateAsLinked;
      expect(await upgrade()).toBe(503);
      // Woken, and the same again for a plain request (on a new link: the pool went with the hibernate).
      Object.assign(route, { desktop_state: 'awake', generation: route.generation + 2 });
      notes.tell(desktopId, { state: 'awake', host_id: HOST_ID, generation: route.generation });
      expect((await send()).status).toBe(503);
    } finally {
      route.desktop_state = 'awake';
      stop();
    }
  });

  it('answer 503 once a move holds a request longer than the ingress waits, and at once when no move is open', async () => {
    const short = await oneRouteIngress(route, SECRET, DOMAIN, 300);
    try {
      gateway.runs = () => false;
      route.moving = true;
      const t0 = Date.now();
      expect((await send('GET', undefined, short)).status).toBe(503);
      expect(Date.now() - t0).toBeGreaterThanOrEqual(300);
      route.moving = false;
      const t1 = Date.now();
      expect((await send('GET', undefined, short)).status).toBe(503);
      expect(Date.now() - t1).toBeLessThan(300);
    } finally {
      await short.close();
    }
  });
});
