/**
 * What the ingress's hand-written relay (scheduler/src/ingress/http-relay.ts) does with HTTP/1.1
 * that the proxy library used to do for it: chunked bodies both ways, pipelined requests,
 * `Connection` kept to each side, `Expect: 100-continue`, HEAD, X-Forwarded headers, and the
 * app failing before or after its answer began. The port gateway is a stand-in that checks the
 * signed line and hands each link to the test's app — a Node HTTP server, or raw bytes — with
 * the link's number, so the test sees which link carried what. Clients are raw TCP sockets, so
 * every byte the ingress sends back is visible.
 */
import { PROTOCOL_VERSION } from '../../shared/src/protocol.js';
import { request } from 'node:http';
import { connect, type Socket } from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import { generateSecretKey, hashToken } from '../../scheduler/src/crypto/secret-box.js';
import type { PortIngress } from '../../scheduler/src/ingress/ingress-server.js';
import { ROUTE_CACHE_TTL_MS } from '../../scheduler/src/ingress/route-cache.js';
import { oneRouteIngress, startStandInGateway, type LinkHandler, type StandInGateway } from '../helpers/port-gateway-stand-in.js';
import { until } from '../helpers/wait.js';

const SECRET = generateSecretKey();
const HOST_ID = newId('host');
const DOMAIN = 'apps.test';
const PORT = 8000;
const desktopId = newId('desktop');
const HOST = `${PORT}-${desktopId}.${DOMAIN}`;
const TOKEN = 'svc_pt_right';

/** The app's default: answers what it saw, as JSON. */
const echoHandler: LinkHandler = (link, req, res) => {
  const parts: Buffer[] = [];
  req.on('data', (c: Buffer) => parts.push(c));
  req.on('end', () => {
    const body = Buffer.concat(parts).toString();
    res.setHeader('content-type', 'application/json');
    res.end(JSON.stringify({ link, method: req.method, url: req.url, headers: req.headers, body }));
  });
};

let gateway: StandInGateway;
let ingress: PortIngress;

beforeAll(async () => {
  gateway = await startStandInGateway(SECRET, HOST_ID, echoHandler);
  ingress = await oneRouteIngress({
    id: newId('port'), org_id: newId('org'), desktop_id: desktopId, port: PORT, public: false, token_hash: hashToken(TOKEN),
    created_at: new Date(), desktop_state: 'awake', generation: 1, host_id: HOST_ID, host_status: 'ready',
    ingress_address: gateway.address, moving: false, host_protocol: PROTOCOL_VERSION,
  }, SECRET, DOMAIN);
});

afterEach(() => {
  gateway.handler = echoHandler;
  gateway.raw = null;
  // Links the test's app kept would carry its handler into the next test.
  for (const s of gateway.open) s.destroy();
});

afterAll(async () => {
  await ingress?.close();
  await gateway?.close();
});

/** A raw client connection to the ingress that collects everything it is sent. */
class Client {
  readonly socket: Socket;
  received = Buffer.alloc(0);
  ended = false;

  constructor() {
    const url = new URL(ingress.url);
    this.socket = connect({ host: url.hostname, port: Number(url.port) });
    this.socket.on('data', (c: Buffer) => (this.received = Buffer.concat([this.received, c])));
    this.socket.on('error', () => {});
    this.socket.on('close', () => (this.ended = true));
  }

  get text(): string {
    return this.received.toString('latin1');
  }

  /** Waits for `count` complete answers and answers them (status, headers, body). */
  async answers(count: number, opts: { head?: boolean } = {}): Promise<Answer[]> {
    let parsed: Answer[] = [];
    await until(() => (parsed = parseAnswers(this.text, opts.head ?? false)).length >= count || (this.ended && parsed.length < count ? fail(this.text) : false), 10_000, `${count} answers`);
    return parsed;
  }
}

function fail(text: string): never {
  throw new Error(`the connection closed after: ${JSON.stringify(text.slice(0, 500))}`);
}

interface Answer {
  status: number;
  headers: Record<string, string>;
  body: string;
}

/** Parses answers sent by Node's server: Content-Length or chunked bodies. */
function parseAnswers(text: string, head: boolean): Answer[] {
  const out: Answer[] = [];
  let at = 0;
  for (;;) {
    const end = text.indexOf('\r\n\r\n', at);
    if (end < 0) return out;
    const lines = text.slice(at, end).split('\r\n');
    const headers: Record<string, string> = {};
    for (const l of lines.slice(1)) headers[l.slice(0, l.indexOf(':')).toLowerCase()] = l.slice(l.indexOf(':') + 1).trim();
    const status = Number(lines[0]!.slice(9, 12));
    let pos = end + 4;
    let body = '';
    if (status === 100 || status === 103) {
      at = pos;
      continue;
    }
    if (head || status === 204 || status === 304) {
      // no body
    } else if (headers['transfer-encoding'] === 'chunked') {
      for (;;) {
        const lineEnd = text.indexOf('\r\n', pos);
        if (lineEnd < 0) return out;
        const size = parseInt(text.slice(pos, lineEnd), 16);
        if (text.length < lineEnd + 2 + size + 2) return out;
        body += text.slice(lineEnd + 2, lineEnd + 2 + size);
        pos = lineEnd + 2 + size + 2;
        if (size === 0) break;
      }
    } else {
      const length = Number(headers['content-length'] ?? 0);
      if (text.length < pos + length) return out;
      body = text.slice(pos, pos + length);
      pos += length;
    }
    out.push({ status, headers, body });
    at = pos;
  }
}

const get = (path = '/', extra = '') => `GET ${path} HTTP/1.1\r\nHost: ${HOST}\r\nX-Svc-Token: ${TOKEN}\r\n${extra}\r\n`;
const seen = (a: Answer) => JSON.parse(a.body) as { link: number; method: string; url: string; headers: Record<string, string>; body: string };

describe('the ingress relay', () => {
  it('sends a chunked request body on as chunks, and the app gets it whole', async () => {
    const c = new Client();
    c.socket.write(`POST /up HTTP/1.1\r\nHost: ${HOST}\r\nX-Svc-Token: ${TOKEN}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n`);
    await until(() => gateway.open.size > 0, 5_000, 'the link');
    c.socket.write('7\r\n, world\r\n0\r\n\r\n');
    const [answer] = await c.answers(1);
    expect(answer!.status).toBe(200);
    expect(seen(answer!).body).toBe('hello, world');
    expect(seen(answer!).headers['transfer-encoding']).toBe('chunked');
    c.socket.destroy();
  });

  it('passes chunked answers on as the client\'s connection frames them, pipelined ones in order', async () => {
    gateway.handler = (link, req, res) => {
      req.resume();
      res.setHeader('x-link', String(link));
      res.write(`${req.url} `);
      // The first answer ends last: the client must still get them in the order it asked.
      setTimeout(() => res.end('done'), req.url === '/a' ? 50 : 0);
    };
    const c = new Client();
    c.socket.write(get('/a') + get('/b'));
    const answers = await c.answers(2);
    expect(answers.map((a) => a.body)).toEqual(['/a done', '/b done']);
    expect(answers[0]!.headers['transfer-encoding']).toBe('chunked');
    // Both links went back to the pool: a later request reuses one of them.
    c.socket.write(get('/c'));
    const [, , later] = await c.answers(3);
    expect([answers[0]!.headers['x-link'], answers[1]!.headers['x-link']]).toContain(later!.headers['x-link']);
    c.socket.destroy();
  });

  it('streams a large chunked answer through, with backpressure, whole', async () => {
    const piece = Buffer.alloc(64 * 1024, 'c');
    const pieces = 80; // 5 MiB
    gateway.handler = (link, req, res) => {
      req.resume();
      let sent = 0;
      const pump = () => {
        while (sent < pieces) {
          sent++;
          if (!res.write(piece)) return void res.once('drain', pump);
        }
        res.end();
      };
      pump();
    };
    const c = new Client();
    c.socket.write(get('/big'));
    const [answer] = await c.answers(1);
    expect(answer!.headers['transfer-encoding']).toBe('chunked');
    expect(answer!.body.length).toBe(piece.length * pieces);
    expect(answer!.body).toBe('c'.repeat(piece.length * pieces));
    c.socket.destroy();
  });

  it('does not reuse a link the app answered before the request body had all been sent', async () => {
    gateway.handler = (link, req, res) => {
      // Answers at once, reading nothing: the link still has the rest of the body in flight.
      res.setHeader('x-link', String(link));
      res.end('too early');
    };
    const c = new Client();
    c.socket.write(`POST / HTTP/1.1\r\nHost: ${HOST}\r\nX-Svc-Token: ${TOKEN}\r\nContent-Length: 10\r\n\r\nfirst`);
    const [early] = await c.answers(1);
    expect(early!.body).toBe('too early');
    c.socket.write('-rest');
    gateway.handler = echoHandler;
    c.socket.write(get('/after'));
    const [, after] = await c.answers(2);
    expect(seen(after!).url).toBe('/after');
    expect(seen(after!).link).toBeGreaterThan(Number(early!.headers['x-link']));
    c.socket.destroy();
  });

  it('sends a bodiless request again on a new link, not on another idle one, when the app closed the reused link', async () => {
    // Two links left idle: two requests in flight at once.
    gateway.handler = (link, req, res) => {
      req.resume();
      setTimeout(() => res.end(JSON.stringify({ link })), 30);
    };
    const c = new Client();
    c.socket.write(get('/1') + get('/2'));
    const warm = (await c.answers(2)).map((a) => seen(a).link);
    expect(new Set(warm).size).toBe(2);
    const tried: number[] = [];
    // The app has dropped both idle links: a request on either meets a close.
    gateway.handler = (link, req, res) => {
      tried.push(link);
      if (warm.includes(link)) return void req.socket.destroy();
      req.resume();
      res.end(JSON.stringify({ link }));
    };
    c.socket.write(get('/3'));
    const [, , third] = await c.answers(3);
    expect(third!.status).toBe(200);
    expect(seen(third!).link).toBeGreaterThan(Math.max(...warm));
    expect(tried).toEqual([warm.at(-1), seen(third!).link]);
    c.socket.destroy();
  });

  it('keeps Connection to each side: the client\'s close closes only its connection, the app\'s only the link', async () => {
    const c = new Client();
    c.socket.write(get('/', 'Connection: close\r\n'));
    const [first] = await c.answers(1);
    expect(first!.headers.connection).toBe('close');
    expect(seen(first!).headers.connection).not.toBe('close');
    await until(() => c.ended, 5_000, 'the client connection to close');

    gateway.handler = (link, req, res) => {
      req.resume();
      res.setHeader('connection', 'close');
      res.end(JSON.stringify({ link }));
    };
    const d = new Client();
    d.socket.write(get('/'));
    const [second] = await d.answers(1);
    // The link the first request left idle carried this one; the app closed it after answering.
    expect(seen(second!).link).toBe(seen(first!).link);
    expect(second!.headers.connection).toBe('keep-alive');
    d.socket.write(get('/'));
    const [, third] = await d.answers(2);
    expect(seen(third!).link).toBeGreaterThan(seen(second!).link);
    expect(d.ended).toBe(false);
    d.socket.destroy();
  });

  it('answers Expect: 100-continue itself and does not send it on', async () => {
    const c = new Client();
    c.socket.write(`PUT /file HTTP/1.1\r\nHost: ${HOST}\r\nX-Svc-Token: ${TOKEN}\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n`);
    await until(() => c.text.startsWith('HTTP/1.1 100 Continue\r\n\r\n'), 5_000, '100 Continue');
    c.socket.write('data');
    const [answer] = await c.answers(1);
    expect(answer!.status).toBe(200);
    expect(seen(answer!).body).toBe('data');
    expect(seen(answer!).headers).not.toHaveProperty('expect');
    c.socket.destroy();
  });

  it('relays HEAD without waiting for a body, and reuses the link', async () => {
    gateway.handler = (link, req, res) => {
      res.writeHead(200, { 'content-length': '1000', 'x-link': String(link) });
      res.end();
    };
    const c = new Client();
    c.socket.write(`HEAD / HTTP/1.1\r\nHost: ${HOST}\r\nX-Svc-Token: ${TOKEN}\r\n\r\n`);
    const [head] = await c.answers(1, { head: true });
    expect(head!.headers['content-length']).toBe('1000');
    c.socket.write(`HEAD / HTTP/1.1\r\nHost: ${HOST}\r\nX-Svc-Token: ${TOKEN}\r\n\r\n`);
    const [, again] = await c.answers(2, { head: true });
    expect(again!.headers['x-link']).toBe(head!.headers['x-link']);
    c.socket.destroy();
  });

  it('appends to X-Forwarded-For, sets X-Forwarded-Host, and never sends the token, whatever its case', async () => {
    const c = new Client();
    c.socket.write(`GET /x?svc_token=other&y=1 HTTP/1.1\r\nHost: ${HOST}\r\nx-SVC-token: ${TOKEN}\r\nX-Forwarded-For: 10.1.2.3\r\n\r\n`);
    const [answer] = await c.answers(1);
    const app = seen(answer!);
    expect(app.url).toBe('/x?y=1');
    expect(app.headers['x-forwarded-for']).toBe('10.1.2.3,127.0.0.1');
    expect(app.headers['x-forwarded-host']).toBe(HOST);
    expect(app.headers['x-forwarded-proto']).toBe('http');
    expect(JSON.stringify(app)).not.toContain(TOKEN);
    c.socket.destroy();
  });

  it('answers 502 when the app closes the link before answering, or answers something that is not HTTP', async () => {
    gateway.raw = (socket) => socket.once('data', () => socket.destroy());
    const c = new Client();
    c.socket.write(`POST / HTTP/1.1\r\nHost: ${HOST}\r\nX-Svc-Token: ${TOKEN}\r\nContent-Length: 2\r\n\r\nhi`);
    const [closed] = await c.answers(1);
    expect(closed!.status).toBe(502);
    expect(closed!.headers['content-type']).toBe('application/problem+json');

    gateway.raw = (socket) => socket.once('data', () => socket.end('SSH-2.0-OpenSSH_9.6\r\n\r\n'));
    c.socket.write(get('/'));
    const [, garbled] = await c.answers(2);
    expect(garbled!.status).toBe(502);
    c.socket.destroy();
  });

  it('cuts the client off when the app dies in the middle of its answer', async () => {
    gateway.raw = (socket) => socket.once('data', () => {
      socket.write('HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part');
      setTimeout(() => socket.destroy(), 20);
    });
    const c = new Client();
    c.socket.write(get('/'));
    await until(() => c.ended, 5_000, 'the client connection to be cut');
    expect(c.text).toMatch(/^HTTP\/1\.1 200 OK\r\n/);
    expect(c.text).toContain('only part');
    expect(parseAnswers(c.text, false)).toEqual([]);
  });

  it('ends a body the app delimits by closing, and opens a new link for the next request', async () => {
    gateway.raw = (socket) => socket.once('data', () => socket.end(`HTTP/1.0 200 OK\r\nX-Link: ${socket.link}\r\n\r\nto the end`));
    const c = new Client();
    c.socket.write(get('/'));
    const [first] = await c.answers(1);
    expect(first!.body).toBe('to the end');
    c.socket.write(get('/'));
    const [, second] = await c.answers(2);
    expect(Number(second!.headers['x-link'])).toBeGreaterThan(Number(first!.headers['x-link']));
    c.socket.destroy();
  });

  it('signs its links with a nonce (/2) for an agent that speaks 1.16, and without (/1) for an older one', async () => {
    const get = (url: string) =>
      new Promise<number>((resolve, reject) => {
        const u = new URL(url);
        request({ host: u.hostname, port: u.port, path: '/', headers: { host: HOST, 'x-svc-token': TOKEN }, agent: false }, (res) => {
          res.resume();
          res.on('end', () => resolve(res.statusCode ?? 0));
        }).on('error', reject).end();
      });
    const before = gateway.versions.length;
    expect(await get(ingress.url)).toBe(200);
    expect(gateway.versions.slice(before)).toEqual(['CANTO-PORT/2']);
    const route = {
      id: newId('port'), org_id: newId('org'), desktop_id: desktopId, port: PORT, public: false, token_hash: hashToken(TOKEN),
      created_at: new Date(), desktop_state: 'awake' as const, generation: 1, host_id: HOST_ID, host_status: 'ready' as const,
      ingress_address: gateway.address, moving: false, host_protocol: '1.15',
    };
    const older = await oneRouteIngress(route, SECRET, DOMAIN);
    try {
      expect(await get(older.url)).toBe(200);
      expect(gateway.versions.slice(before + 1)).toEqual(['CANTO-PORT/1']);
      // The host's agent is upgraded under the running desktop (same generation): its links are
      // made anew, with the line it now takes, not kept sending one that can be replayed.
      route.host_protocol = PROTOCOL_VERSION;
      // Once the route is read again (cached routes live ROUTE_CACHE_TTL_MS).
      await new Promise((resolve) => setTimeout(resolve, ROUTE_CACHE_TTL_MS + 100));
      expect(await get(older.url)).toBe(200);
      expect(gateway.versions.slice(before + 2)).toEqual(['CANTO-PORT/2']);
    } finally {
      await older.close();
    }
  });
});
