/**
 * The world of the port-exposure tests (api-ports.test.ts, ingress-ports.test.ts): a real
 * scheduler with the ingress on, a local HTTP app standing for a guest app, a stand-in port
 * gateway that speaks shared/src/port-link.ts for a host row made here, and the calls through the
 * ingress (HTTP and WebSocket) the tests make.
 */
import { createHash } from 'node:crypto';
import { createServer as createHttpServer, request, type IncomingMessage, type Server } from 'node:http';
import { connect, createServer as createTcpServer, type AddressInfo, type Server as TcpServer, type Socket } from 'node:net';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, expect } from 'vitest';
import WebSocket, { WebSocketServer } from 'ws';
import { newId } from '../../shared/src/ids.js';
import { portLinkKey, verifyPortLink, type PortTarget } from '../../shared/src/port-link.js';
import { generateSecretKey } from '../../scheduler/src/crypto/secret-box.js';
import { PROTOCOL_VERSION } from '../../shared/src/protocol.js';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { api, mintKey, startTestScheduler, type TestScheduler } from './scheduler.js';
import { expectProblem, type ApiResponse } from './problem.js';

export type Call = ReturnType<typeof api>;

export const MiB = 1024 * 1024;
export const BASE = { domain: 'apps.test', port: 8443 };
/** The schedulers' secret key: the stand-in gateway derives its host's port-link key from it. */
export const SECRET_KEY = generateSecretKey();
export const INGRESS_ENV = {
  CANTO_SECRET_KEY: SECRET_KEY,
  CANTO_INGRESS_BASE_URL: `http://APPS.test:${BASE.port}`,
  CANTO_INGRESS_LISTEN: '127.0.0.1:0',
  // The stand-in host below never heartbeats; keep host health away from it and its desktops.
  CANTO_HOST_DOWN_MS: '3600000',
  CANTO_HOST_FAILURE_GRACE_MS: '3600000',
};
export const sha = (b: Uint8Array) => createHash('sha256').update(b).digest('hex');

export let s: TestScheduler;
export let sql: Sql;
export let alice: Call;
export let bob: Call;
export let aliceOrg: string;
export let app: GuestApp;
export let gateway: StandInGateway;
export let standInHost: string;

/**
 * Starts the world every test file of port exposures uses, around the calling file: a scheduler
 * with the ingress on, two orgs' keys, the stand-in guest app and a stand-in host whose port
 * gateway is the stand-in gateway. Call it once at the top level of a test file; the bindings
 * above are set in its beforeAll (vitest loads this module afresh for every test file).
 */
export function usePortsWorld(): void {
  beforeAll(async () => {
    s = await startTestScheduler(INGRESS_ENV);
    sql = connectDatabase(s.databaseUrl, { max: 2 });
    alice = api(s.url, await mintKey(s.databaseUrl, 'ports-alice'));
    bob = api(s.url, await mintKey(s.databaseUrl, 'ports-bob'));
    aliceOrg = (await sql<Array<{ id: string }>>`SELECT id FROM orgs WHERE name = 'ports-alice'`)[0]!.id;
    app = await startGuestApp();
    standInHost = newId('host');
    gateway = await startStandInGateway(portLinkKey(SECRET_KEY, standInHost));
    // A host that is up and runs `gateway` as its port gateway, but has no agent link (so nothing
    // is ever placed on it) and is cordoned besides.
    await sql`
      INSERT INTO hosts (id, hostname, agent_instance_id, protocol, runtime, memory_snapshots, vcpus, memory_mb, status, cordoned, ingress_address)
      VALUES (${standInHost}, 'stand-in', ${newId('host')}, ${PROTOCOL_VERSION}, 'stand-in', false, 2, 4096, 'ready', true, ${gateway.address})`;
  });

  afterAll(async () => {
    await gateway?.close();
    await app?.close();
    await sql?.end();
    await s?.close();
  });
}

/** An awake desktop of alice's on the stand-in host, made in the database directly. */
export async function standInDesktop(generation = 7): Promise<string> {
  const id = newId('desktop');
  await sql`
    INSERT INTO desktops (id, org_id, tier, state, image_version, generation, current_generation_id, idle_timeout_secs, billing_mode, host_id)
    VALUES (${id}, ${aliceOrg}, 'small', 'awake', 'debian-12', ${generation}, ${newId('generation')}, 0, 'hourly', ${standInHost})`;
  return id;
}

export async function expose(c: Call, desktopId: string, port: number, isPublic?: boolean) {
  const res = await c('POST', `/v1/desktops/${desktopId}/ports`, isPublic === undefined ? { port } : { port, public: isPublic });
  expect(res.status, res.text).toBe(201);
  return res.json as { id: string; port: number; public: boolean; url: string; status: string; created_at: string; token?: string };
}

export interface IngressReply extends ApiResponse {
  body: Buffer;
}

export function ingressAddress(): { host: string; port: number } {
  const u = new URL(s.ingressUrl!);
  return { host: u.hostname, port: Number(u.port) };
}

/** One request to the ingress for the exposure at `url` (its host goes in the Host header). */
export function through(url: string, path = '/', init: { method?: string; headers?: Record<string, string>; body?: Buffer } = {}): Promise<IngressReply> {
  const target = new URL(url);
  const { host, port } = ingressAddress();
  return new Promise((resolve, reject) => {
    const req = request({ host, port, method: init.method ?? 'GET', path, agent: false, headers: { host: target.host, ...init.headers } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('error', reject);
      res.on('end', () => {
        const body = Buffer.concat(chunks);
        const text = body.length < MiB ? body.toString('utf8') : '';
        let json: any = null;
        try {
          json = text ? JSON.parse(text) : null;
        } catch {
          json = null;
        }
        const headers = new Headers();
        for (const [k, v] of Object.entries(res.headers)) if (v !== undefined) headers.set(k, Array.isArray(v) ? v.join(', ') : v);
        resolve({ status: res.statusCode!, headers, text, json, body });
      });
    });
    req.on('error', reject);
    if (init.body) {
      // In chunks, as a client streaming an upload would.
      const body = init.body;
      Readable.from((function* () {
        for (let i = 0; i < body.length; i += 256 * 1024) yield body.subarray(i, i + 256 * 1024);
      })()).pipe(req);
    } else {
      req.end();
    }
  });
}

export function expectIngressProblem(res: IngressReply, status: number, what = ''): void {
  expectProblem(res, status, what);
}

export function wsUrl(url: string, path: string): { address: string; host: string } {
  const { host, port } = ingressAddress();
  return { address: `ws://${host}:${port}${path}`, host: new URL(url).host };
}

export async function openWs(url: string, path: string, onUpgrade?: (res: IncomingMessage) => void): Promise<WebSocket> {
  const { address, host } = wsUrl(url, path);
  const ws = new WebSocket(address, { headers: { host } });
  if (onUpgrade) ws.once('upgrade', onUpgrade);
  await new Promise((resolve, reject) => ws.once('open', resolve).once('error', reject).once('unexpected-response', (_req, res) => reject(new Error(`upgrade answered ${res.statusCode}`))));
  return ws;
}

/** The status an upgrade that is refused gets. */
export async function wsRefusal(url: string, path: string): Promise<number> {
  const { address, host } = wsUrl(url, path);
  const ws = new WebSocket(address, { headers: { host } });
  return new Promise((resolve, reject) => {
    ws.once('open', () => reject(new Error('the upgrade was accepted')));
    ws.once('unexpected-response', (_req, res) => {
      res.resume();
      resolve(res.statusCode!);
      ws.terminate();
    });
    ws.once('error', () => {});
  });
}

export function echo(ws: WebSocket, message: string): Promise<string>;
export function echo(ws: WebSocket, message: Buffer, binary: true): Promise<Buffer>;
export function echo(ws: WebSocket, message: string | Buffer, binary = false): Promise<string | Buffer> {
  return new Promise((resolve, reject) => {
    ws.once('message', (data: Buffer, isBinary: boolean) => resolve(isBinary ? data : data.toString('utf8')));
    ws.once('error', reject);
    ws.send(message, { binary });
  });
}

export interface GuestApp {
  readonly port: number;
  /** A port on which nothing listens. */
  readonly closedPort: number;
  /** Request URLs the app has seen. */
  readonly requests: string[];
  close(): Promise<void>;
}

/**
 * The guest's app: `POST /echo` streams the body back; a WebSocket echoes; anything else answers
 * JSON with the URL and headers it received.
 */
export async function startGuestApp(): Promise<GuestApp> {
  const requests: string[] = [];
  const server: Server = createHttpServer((req, res) => {
    requests.push(req.url ?? '');
    if (req.method === 'POST' && req.url === '/echo') {
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      req.pipe(res);
      return;
    }
    req.resume();
    // An app that scopes a cookie to the whole ingress domain (which the ingress must not let through).
    if (req.url?.includes('cookie')) res.setHeader('set-cookie', ['s=1; Domain=apps.test; Path=/', 'plain=2']);
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ method: req.method, url: req.url, headers: req.headers }));
  });
  const wss = new WebSocketServer({ server, maxPayload: 16 * MiB });
  wss.on('connection', (ws) => ws.on('message', (data, isBinary) => ws.send(data, { binary: isBinary })));
  wss.on('headers', (headers, req) => {
    if (req.url?.includes('cookie')) headers.push('Set-Cookie: w=1; Domain=apps.test; Path=/');
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const spare = createTcpServer();
  await new Promise<void>((resolve) => spare.listen(0, '127.0.0.1', resolve));
  const closedPort = (spare.address() as AddressInfo).port;
  await new Promise((resolve) => spare.close(resolve));
  return {
    port: (server.address() as AddressInfo).port,
    closedPort,
    requests,
    async close() {
      for (const client of wss.clients) client.terminate();
      wss.close();
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

export type GatewayMode = 'relay' | 'not_running' | 'unavailable' | 'refused' | 'unauthorized' | 'garbage';

export interface StandInGateway {
  address: string;
  mode: GatewayMode;
  lastTarget: PortTarget | null;
  close(): Promise<void>;
}

/**
 * A port gateway speaking shared/src/port-link.ts: it checks the signed line with the join token
 * and relays to `127.0.0.1:<port>`, or answers as `mode` says.
 */
export async function startStandInGateway(key: string): Promise<StandInGateway> {
  const sockets = new Set<Socket>();
  const state: StandInGateway = {
    address: '',
    mode: 'relay',
    lastTarget: null,
    async close() {
      for (const socket of sockets) socket.destroy();
      await new Promise((resolve) => server.close(resolve));
    },
  };
  const server: TcpServer = createTcpServer((socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    socket.on('error', () => {});
    let buffered = Buffer.alloc(0);
    const onData = (chunk: Buffer) => {
      buffered = Buffer.concat([buffered, chunk]);
      const newline = buffered.indexOf(0x0a);
      if (newline === -1) return;
      socket.off('data', onData);
      socket.pause();
      const target = verifyPortLink(key, buffered.subarray(0, newline).toString('latin1'))?.target ?? null;
      const rest = buffered.subarray(newline + 1);
      if (!target) return void socket.end('ERR unauthorized\n');
      state.lastTarget = target;
      if (state.mode === 'garbage') return void socket.end('HTTP/1.1 400 Bad Request\r\n\r\n');
      if (state.mode !== 'relay') return void socket.end(`ERR ${state.mode}\n`);
      const guest = connect({ host: '127.0.0.1', port: target.port });
      sockets.add(guest);
      guest.on('close', () => sockets.delete(guest));
      guest.on('error', () => socket.destroy());
      guest.once('connect', () => {
        socket.write('OK\n');
        if (rest.length > 0) guest.write(rest);
        socket.pipe(guest).pipe(socket);
        socket.resume();
      });
      socket.on('close', () => guest.destroy());
    };
    socket.on('data', onData);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  state.address = `127.0.0.1:${(server.address() as AddressInfo).port}`;
  return state;
}
