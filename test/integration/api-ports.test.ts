/**
 * Port exposures and the ingress (docs/api.md §2.9, 4.7), with a real scheduler:
 *
 * - the API's rules (list without tokens, create with a token shown once and stored hashed,
 *   400/404/409/501, delete, org isolation down to byte-identical 404 bodies);
 * - the ingress's own answers, against a stand-in port gateway that speaks shared/src/port-link.ts
 *   for a desktop row made here (404 for unknown hosts and deleted exposures, 401 without the
 *   right token, 503 while unbound, each port-link refusal's status), and proxying through it to
 *   a local HTTP app standing for the guest app: tokens stripped, Authorization untouched, a
 *   WebSocket echo, a 20 MiB body streamed both ways;
 * - the same traffic through a real agent on the FakeDriver, whose port gateway opens
 *   `127.0.0.1:<port>` on the host for the guest port: hibernate answers 503, wake brings the
 *   URL back, delete makes it 404 for good.
 */
import { createHash, randomBytes } from 'node:crypto';
import { createServer as createHttpServer, request, type Server } from 'node:http';
import { connect, createServer as createTcpServer, type AddressInfo, type Server as TcpServer, type Socket } from 'node:net';
import { Readable } from 'node:stream';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import WebSocket, { WebSocketServer } from 'ws';
import { newId } from '../../shared/src/ids.js';
import { portLinkKey, verifyPortLinkLine, type PortTarget } from '../../shared/src/port-link.js';
import { generateSecretKey } from '../../scheduler/src/crypto/secret-box.js';
import { PROTOCOL_VERSION } from '../../shared/src/protocol.js';
import { RpcPeer } from '../../shared/src/rpc.js';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { loadSchedulerConfig } from '../../scheduler/src/config.js';
import { parseExposureHost } from '../../scheduler/src/services/exposure-host.js';
import { withoutTokenParam } from '../../scheduler/src/ingress/port-token.js';
import { ROUTE_CACHE_TTL_MS } from '../../scheduler/src/ingress/route-cache.js';
import { api, JOIN_TOKEN, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { expectProblem, type ApiResponse } from '../helpers/problem.js';

type Call = ReturnType<typeof api>;

const MiB = 1024 * 1024;
const BASE = { domain: 'apps.test', port: 8443 };
/** The schedulers' secret key: the stand-in gateway derives its host's port-link key from it. */
const SECRET_KEY = generateSecretKey();
const INGRESS_ENV = {
  CANTO_SECRET_KEY: SECRET_KEY,
  CANTO_INGRESS_BASE_URL: `http://APPS.test:${BASE.port}`,
  CANTO_INGRESS_LISTEN: '127.0.0.1:0',
  // The stand-in host below never heartbeats; keep host health away from it and its desktops.
  CANTO_HOST_DOWN_MS: '3600000',
  CANTO_HOST_FAILURE_GRACE_MS: '3600000',
};
const sha = (b: Uint8Array) => createHash('sha256').update(b).digest('hex');

let s: TestScheduler;
let sql: Sql;
let alice: Call;
let bob: Call;
let aliceOrg: string;
let app: GuestApp;
let gateway: StandInGateway;
let standInHost: string;

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

/** An awake desktop of alice's on the stand-in host, made in the database directly. */
async function standInDesktop(generation = 7): Promise<string> {
  const id = newId('desktop');
  await sql`
    INSERT INTO desktops (id, org_id, tier, state, image_version, generation, current_generation_id, idle_timeout_secs, billing_mode, host_id)
    VALUES (${id}, ${aliceOrg}, 'small', 'awake', 'debian-12', ${generation}, ${newId('generation')}, 0, 'hourly', ${standInHost})`;
  return id;
}

async function expose(c: Call, desktopId: string, port: number, isPublic?: boolean) {
  const res = await c('POST', `/v1/desktops/${desktopId}/ports`, isPublic === undefined ? { port } : { port, public: isPublic });
  expect(res.status, res.text).toBe(201);
  return res.json as { id: string; port: number; public: boolean; url: string; status: string; created_at: string; token?: string };
}

/* ------------------------------------------------------------------ the API */

describe('POST /v1/desktops/{id}/ports', () => {
  it('answers 201 with a private exposure and its token, shown this once and stored hashed', async () => {
    const id = await standInDesktop();
    const res = await alice('POST', `/v1/desktops/${id}/ports`, { port: 8080 });
    expect(res.status, res.text).toBe(201);
    expect(res.json).toEqual({
      id: expect.stringMatching(/^prt_[0-9a-v]{24}$/),
      port: 8080,
      public: false,
      url: `http://8080-${id}.${BASE.domain}:${BASE.port}`,
      status: 'bound',
      created_at: expect.any(String),
      token: expect.stringMatching(/^svc_pt_[A-Za-z0-9_-]{43}$/),
    });
    expect(new Date(res.json.created_at).toISOString()).toBe(res.json.created_at);
    const [row] = await sql<Array<{ token_hash: string; org_id: string }>>`SELECT token_hash, org_id FROM port_exposures WHERE id = ${res.json.id}`;
    expect(row!.token_hash).toBe(sha(Buffer.from(res.json.token)));
    expect(row!.org_id).toBe(aliceOrg);

    const list = await alice('GET', `/v1/desktops/${id}/ports`);
    expect(list.status).toBe(200);
    const { token: _token, ...withoutToken } = res.json;
    expect(list.json).toEqual({ ports: [withoutToken] });
    expect(list.text).not.toContain('token');
  });

  it('creates a public exposure without a token (absent, not null)', async () => {
    const id = await standInDesktop();
    const created = await expose(alice, id, 3000, true);
    expect(created).not.toHaveProperty('token');
    expect(created.public).toBe(true);
    const [row] = await sql<Array<{ token_hash: string | null }>>`SELECT token_hash FROM port_exposures WHERE id = ${created.id}`;
    expect(row!.token_hash).toBeNull();
  });

  it('defaults public to false and accepts the port range ends', async () => {
    const id = await standInDesktop();
    expect((await expose(alice, id, 1)).public).toBe(false);
    expect((await expose(alice, id, 65535, false)).token).toMatch(/^svc_pt_/);
    const list = await alice('GET', `/v1/desktops/${id}/ports`);
    expect(list.json.ports.map((p: { port: number }) => p.port)).toEqual([1, 65535]);
  });

  it.each([
    ['port 0', { port: 0 }],
    ['port 65536', { port: 65536 }],
    ['a negative port', { port: -80 }],
    ['a fractional port', { port: 80.5 }],
    ['the port as a string', { port: '80' }],
    ['no port', {}],
    ['a null port', { port: null }],
    ['public not a boolean', { port: 80, public: 'yes' }],
  ])('answers 400 for %s', async (_what, body) => {
    const id = await standInDesktop();
    expectProblem(await alice('POST', `/v1/desktops/${id}/ports`, body), 400, JSON.stringify(body));
    expect((await alice('GET', `/v1/desktops/${id}/ports`)).json).toEqual({ ports: [] });
  });

  it('answers 400 for a malformed body and a malformed desktop id', async () => {
    const id = await standInDesktop();
    expectProblem(await alice('POST', `/v1/desktops/${id}/ports`, '{"port": 80'), 400);
    expectProblem(await alice('POST', '/v1/desktops/not-a-desktop/ports', { port: 80 }), 400);
    expectProblem(await alice('GET', '/v1/desktops/not-a-desktop/ports'), 400);
  });

  it('answers 409 when the port is already exposed, public or not, and allows it again after a delete', async () => {
    const id = await standInDesktop();
    const first = await expose(alice, id, 5000);
    expectProblem(await alice('POST', `/v1/desktops/${id}/ports`, { port: 5000 }), 409);
    expectProblem(await alice('POST', `/v1/desktops/${id}/ports`, { port: 5000, public: true }), 409);
    expect((await alice('DELETE', `/v1/desktops/${id}/ports/5000`)).status).toBe(204);
    const again = await expose(alice, id, 5000);
    expect(again.id).not.toBe(first.id);
    expect(again.token).not.toBe(first.token);
  });

  it('leaves no exposure behind when a destroy commits while the create runs', async () => {
    const id = await standInDesktop();
    let creating: Promise<ApiResponse> | null = null;
    await sql.begin(async (tx) => {
      // What the destroy step does, holding the desktop's row until the create has been sent.
      await tx`UPDATE desktops SET state = 'destroyed' WHERE id = ${id}`;
      await tx`DELETE FROM port_exposures WHERE desktop_id = ${id}`;
      creating = alice('POST', `/v1/desktops/${id}/ports`, { port: 8123 });
      await new Promise((r) => setTimeout(r, 300));
    });
    const res = await creating!;
    expect([404, 409]).toContain(res.status);
    expect(await sql`SELECT id FROM port_exposures WHERE desktop_id = ${id}`).toHaveLength(0);
  });

  it('answers 409 for a desktop that is not awake', async () => {
    const id = await standInDesktop();
    for (const state of ['provisioning', 'waking', 'hibernating', 'hibernated', 'destroyed']) {
      await sql`UPDATE desktops SET state = ${state} WHERE id = ${id}`;
      expectProblem(await alice('POST', `/v1/desktops/${id}/ports`, { port: 80 }), 409, state);
    }
    expect((await alice('GET', `/v1/desktops/${id}/ports`)).json).toEqual({ ports: [] });
  });

  it('answers 404 for a missing desktop', async () => {
    expectProblem(await alice('POST', `/v1/desktops/${newId('desktop')}/ports`, { port: 80 }), 404);
    expectProblem(await alice('GET', `/v1/desktops/${newId('desktop')}/ports`), 404);
  });

  it('answers 401 without credentials', async () => {
    const id = await standInDesktop();
    const none = api(s.url, 'svc_sk_wrong');
    expectProblem(await none('GET', `/v1/desktops/${id}/ports`), 401);
    expectProblem(await none('POST', `/v1/desktops/${id}/ports`, { port: 80 }), 401);
    expectProblem(await none('DELETE', `/v1/desktops/${id}/ports/80`), 401);
  });
});

describe('GET /v1/desktops/{id}/ports', () => {
  it('lists by port, with status unbound while the desktop is not awake or its host is down', async () => {
    const id = await standInDesktop();
    await expose(alice, id, 9000);
    await expose(alice, id, 22, true);
    const status = async () => (await alice('GET', `/v1/desktops/${id}/ports`)).json.ports.map((p: { port: number; status: string }) => `${p.port}:${p.status}`);
    expect(await status()).toEqual(['22:bound', '9000:bound']);
    await sql`UPDATE desktops SET state = 'hibernated' WHERE id = ${id}`;
    expect(await status()).toEqual(['22:unbound', '9000:unbound']);
    await sql`UPDATE desktops SET state = 'awake' WHERE id = ${id}`;
    const otherHost = newId('host');
    await sql`
      INSERT INTO hosts (id, hostname, agent_instance_id, protocol, runtime, memory_snapshots, vcpus, memory_mb, status, cordoned, ingress_address)
      VALUES (${otherHost}, 'down', ${newId('host')}, ${PROTOCOL_VERSION}, 'stand-in', false, 2, 4096, 'down', true, '127.0.0.1:9')`;
    await sql`UPDATE desktops SET host_id = ${otherHost} WHERE id = ${id}`;
    expect(await status()).toEqual(['22:unbound', '9000:unbound']);
    await sql`UPDATE hosts SET status = 'ready', ingress_address = NULL WHERE id = ${otherHost}`;
    expect(await status()).toEqual(['22:unbound', '9000:unbound']);
    await sql`UPDATE desktops SET host_id = ${standInHost} WHERE id = ${id}`;
    expect(await status()).toEqual(['22:bound', '9000:bound']);
  });
});

describe('DELETE /v1/desktops/{id}/ports/{port}', () => {
  it('answers 204, then 404', async () => {
    const id = await standInDesktop();
    await expose(alice, id, 8000);
    const res = await alice('DELETE', `/v1/desktops/${id}/ports/8000`);
    expect(res.status).toBe(204);
    expect(res.text).toBe('');
    expectProblem(await alice('DELETE', `/v1/desktops/${id}/ports/8000`), 404);
    expect((await alice('GET', `/v1/desktops/${id}/ports`)).json).toEqual({ ports: [] });
  });

  it.each(['8001', '0', '65536', '99999', 'abc', '08000x'])('answers 404 for port %s, not exposed or not a port', async (port) => {
    const id = await standInDesktop();
    await expose(alice, id, 8000);
    expectProblem(await alice('DELETE', `/v1/desktops/${id}/ports/${port}`), 404);
  });

  it('answers 404 for a missing desktop and 400 for a malformed desktop id', async () => {
    expectProblem(await alice('DELETE', `/v1/desktops/${newId('desktop')}/ports/80`), 404);
    expectProblem(await alice('DELETE', '/v1/desktops/nope/ports/80'), 400);
  });
});

describe('another org', () => {
  it.each([
    ['GET', '', undefined],
    ['POST', '', { port: 4000 }],
    ['DELETE', '/4000', undefined],
  ])('%s /v1/desktops/{theirs}/ports%s answers 404 byte-identical to a missing desktop', async (method, suffix, body) => {
    const theirs = await standInDesktop();
    await expose(alice, theirs, 4000);
    const missing = newId('desktop');
    const a = await bob(method, `/v1/desktops/${theirs}/ports${suffix}`, body);
    const b = await bob(method, `/v1/desktops/${missing}/ports${suffix}`, body);
    expectProblem(a, 404);
    expect(a.text).toBe(b.text);
    expect(a.headers.get('content-type')).toBe(b.headers.get('content-type'));
    expect(a.headers.get('content-length')).toBe(b.headers.get('content-length'));
    // Nothing bob tried changed alice's exposures.
    expect((await alice('GET', `/v1/desktops/${theirs}/ports`)).json.ports.map((p: { port: number }) => p.port)).toEqual([4000]);
  });
});

describe('without an ingress', () => {
  let plain: TestScheduler;
  let call: Call;

  beforeAll(async () => {
    plain = await startTestScheduler();
    call = api(plain.url, await mintKey(plain.databaseUrl, 'no-ingress'));
  });

  afterAll(async () => {
    await plain?.close();
  });

  it('answers 501 to a create, lists nothing, and runs no ingress', async () => {
    const created = await call('POST', '/v1/desktops', { tier: 'small' });
    expectProblem(await call('POST', `/v1/desktops/${created.json.id}/ports`, { port: 8080 }), 501);
    expect((await call('GET', `/v1/desktops/${created.json.id}/ports`)).json).toEqual({ ports: [] });
    expectProblem(await call('DELETE', `/v1/desktops/${created.json.id}/ports/8080`), 404);
    expect(plain.ingressUrl).toBeNull();
  });
});

describe("the agent's hello", () => {
  /** A hand-made agent's hello (on a link of its own, closed after the reply), and the reply. */
  async function hello(hostId: string, ingress?: { host: string; port: number }): Promise<{ port_link_key?: string }> {
    await until(() => s.leadership.isLeader(), 5_000, 'leadership');
    const ws = new WebSocket(`${s.url.replace(/^http/, 'ws')}/internal/agents/ws`, { headers: { authorization: `Bearer ${JOIN_TOKEN}` } });
    await new Promise((resolve, reject) => ws.once('open', resolve).once('error', reject));
    const closed = new Promise((resolve) => ws.once('close', resolve));
    const reply = await new RpcPeer(ws).request('hello', {
      protocol: PROTOCOL_VERSION,
      host_id: hostId,
      agent_instance_id: newId('host'),
      hostname: 'hand-made',
      capabilities: { runtime: 'hand-made', memory_snapshots: false },
      capacity: { vcpus: 2, memory_mb: 4096 },
      desktops: [],
      ...(ingress ? { ingress } : {}),
    }, 5_000);
    ws.close();
    await closed;
    return reply as { port_link_key?: string };
  }

  it('hands each host a port-link key of its own, which neither the join token nor another host key is', async () => {
    const [a, b] = [newId('host'), newId('host')];
    const keys = [(await hello(a)).port_link_key, (await hello(b)).port_link_key];
    expect(keys).toEqual([portLinkKey(SECRET_KEY, a), portLinkKey(SECRET_KEY, b)]);
    expect(keys[0]).not.toBe(keys[1]);
    expect(keys).not.toContain(JOIN_TOKEN);
  });

  it('records the port gateway address, and clears it when a later hello has none', async () => {
    const hostId = newId('host');
    const address = async () => (await sql<Array<{ ingress_address: string | null }>>`SELECT ingress_address FROM hosts WHERE id = ${hostId}`)[0]?.ingress_address;
    for (const [sent, recorded] of [
      [{ host: '10.0.0.5', port: 7011 }, '10.0.0.5:7011'],
      [{ host: 'fd00::5', port: 7012 }, '[fd00::5]:7012'],
      [undefined, null],
    ] as const) {
      await hello(hostId, sent);
      expect(await address()).toBe(recorded);
    }
  });
});

/* ------------------------------------------------------------------ the ingress */

describe('the ingress settings', () => {
  const load = (env: Record<string, string>) => loadSchedulerConfig({ DATABASE_URL: 'postgres://x/y', CANTO_SECRET_KEY: 'k', ...env }).ingress;

  it('are off without CANTO_INGRESS_BASE_URL, and default to listening on 0.0.0.0:8081', () => {
    expect(load({})).toBeNull();
    expect(load({ CANTO_INGRESS_BASE_URL: 'https://Apps.Example.com/' })).toEqual({
      scheme: 'https', domain: 'apps.example.com', urlPort: null, listenHost: '0.0.0.0', listenPort: 8081,
    });
    expect(load({ CANTO_INGRESS_BASE_URL: 'http://localhost:8081', CANTO_INGRESS_LISTEN: '127.0.0.1:9000' })).toEqual({
      scheme: 'http', domain: 'localhost', urlPort: 8081, listenHost: '127.0.0.1', listenPort: 9000,
    });
  });

  it.each(['apps.example.com', 'ftp://apps.example.com', 'https://apps.example.com/path', 'https://u:p@apps.example.com', 'https://apps.example.com/?q', 'http://10.0.0.1', 'http://[::1]:8081'])(
    'refuse %s as a base URL',
    (base) => {
      expect(() => load({ CANTO_INGRESS_BASE_URL: base })).toThrow(/CANTO_INGRESS_BASE_URL/);
    },
  );
});

describe('the ingress host names', () => {
  const settings = { scheme: 'https' as const, domain: 'apps.example.com', urlPort: null };
  const id = newId('desktop');

  it.each([
    [`8080-${id}.apps.example.com`, 8080],
    [`8080-${id}.APPS.example.com:443`, 8080],
    [`8080-${id.toUpperCase()}.apps.example.com`, 8080],
    [`65535-${id}.apps.example.com.`, 65535],
    [`1-${id}.apps.example.com:1`, 1],
  ])('maps %s', (host, port) => {
    expect(parseExposureHost(settings, host)).toEqual({ desktopId: id, port });
  });

  it.each([
    undefined,
    '',
    'apps.example.com',
    `${id}.apps.example.com`,
    `0-${id}.apps.example.com`,
    `08080-${id}.apps.example.com`,
    `65536-${id}.apps.example.com`,
    `8080-${id}.apps.example.org`,
    `8080-${id}.evil.apps.example.com`,
    `x.8080-${id}.apps.example.com`,
    `8080-${newId('operation')}.apps.example.com`,
    `8080-dsk_short.apps.example.com`,
    `8080-${id}xapps.example.com`,
  ])('refuses %s', (host) => {
    expect(parseExposureHost(settings, host)).toBeNull();
  });

  it('strips svc_token from the query and keeps every other byte', () => {
    expect(withoutTokenParam('/a?svc_token=x')).toBe('/a');
    expect(withoutTokenParam('/a?b=1&svc_token=x&c=%20+&svc_token=y')).toBe('/a?b=1&c=%20+');
    expect(withoutTokenParam('/a?svc%5Ftoken=x&svc_tokens=1')).toBe('/a?svc_tokens=1');
    expect(withoutTokenParam('/a?svc_token')).toBe('/a');
    expect(withoutTokenParam('/a')).toBe('/a');
    expect(withoutTokenParam('/a?q=svc_token%3Dx')).toBe('/a?q=svc_token%3Dx');
  });
});

describe('the ingress, through a stand-in port gateway', () => {
  it('answers 404 for hosts that name no exposure, the same body every time', async () => {
    const id = await standInDesktop();
    await expose(alice, id, app.port);
    const bodies = new Set<string>();
    for (const host of [`${BASE.domain}:${BASE.port}`, 'unrelated.example', `${app.port + 1}-${id}.${BASE.domain}`, `${app.port}-${newId('desktop')}.${BASE.domain}`, `${app.port}-${id}.other.test`]) {
      const res = await through(`http://${host}/`);
      expectIngressProblem(res, 404, host);
      bodies.add(res.text);
    }
    expect(bodies.size).toBe(1);
  });

  it('reaches a private exposure with the token in the query or the header, and strips it', async () => {
    const id = await standInDesktop(11);
    const { url, token } = await expose(alice, id, app.port);
    const viaQuery = await through(url, `/hello?a=1&svc_token=${encodeURIComponent(token!)}&b=%2F`, { headers: { authorization: 'Bearer app-credential' } });
    expect(viaQuery.status, viaQuery.text).toBe(200);
    expect(viaQuery.json.url).toBe('/hello?a=1&b=%2F');
    expect(viaQuery.json.headers.authorization).toBe('Bearer app-credential');
    expect(viaQuery.json.headers.host).toBe(new URL(url).host);
    expect(viaQuery.json.headers['x-forwarded-proto']).toBe('http');
    expect(gateway.lastTarget).toEqual({ desktopId: id, generation: 11, port: app.port });

    const viaHeader = await through(url, '/hello', { headers: { 'x-svc-token': token!, authorization: 'Basic dXNlcjpwdw==' } });
    expect(viaHeader.status, viaHeader.text).toBe(200);
    expect(viaHeader.json.url).toBe('/hello');
    expect(viaHeader.json.headers).not.toHaveProperty('x-svc-token');
    expect(viaHeader.json.headers.authorization).toBe('Basic dXNlcjpwdw==');
    expect(JSON.stringify(viaHeader.json)).not.toContain(token!);
  });

  it('answers 401 without the token, with a wrong one, and with the token of another exposure', async () => {
    const id = await standInDesktop();
    const { url, token } = await expose(alice, id, app.port);
    const other = await expose(alice, await standInDesktop(), app.port);
    const sameDesktop = await expose(alice, id, app.port + 1);
    for (const [what, path, headers] of [
      ['none', '/', {}],
      ['an empty header', '/', { 'x-svc-token': '' }],
      ['a wrong token', '/?svc_token=svc_pt_wrong', {}],
      ["another desktop's token", `/?svc_token=${other.token}`, {}],
      ["another port's token", '/', { 'x-svc-token': sameDesktop.token! }],
      ['the token in Authorization', '/', { authorization: `Bearer ${token}` }],
      ['a right query under a wrong header', `/?svc_token=${token}`, { 'x-svc-token': 'svc_pt_wrong' }],
    ] as const) {
      expectIngressProblem(await through(url, path, { headers }), 401, what);
    }
    expect(app.requests).not.toContain('/?svc_token=svc_pt_wrong');
  });

  it('needs no token for a public exposure, and leaves a svc_token the app did not ask for out too', async () => {
    const id = await standInDesktop();
    const { url } = await expose(alice, id, app.port, true);
    const res = await through(url, '/public?svc_token=whatever&x=1');
    expect(res.status, res.text).toBe(200);
    expect(res.json.url).toBe('/public?x=1');
  });

  it('streams a 20 MiB body up and back down', async () => {
    const id = await standInDesktop();
    const { url, token } = await expose(alice, id, app.port);
    const data = randomBytes(20 * MiB);
    const res = await through(url, '/echo', { method: 'POST', headers: { 'x-svc-token': token! }, body: data });
    expect(res.status).toBe(200);
    expect(res.body.length).toBe(data.length);
    expect(sha(res.body)).toBe(sha(data));
  });

  it('passes a WebSocket through, and refuses one without the token', async () => {
    const id = await standInDesktop();
    const { url, token } = await expose(alice, id, app.port);
    const ws = await openWs(url, `/ws?svc_token=${token}`);
    expect(await echo(ws, 'hello through the ingress')).toBe('hello through the ingress');
    const big = randomBytes(3 * MiB);
    expect(sha(await echo(ws, big, true))).toBe(sha(big));
    ws.close();
    expect(await wsRefusal(url, '/ws')).toBe(401);
    expect(await wsRefusal(`http://1-${id}.${BASE.domain}`, '/ws')).toBe(404);
  });

  it('answers 503 with Retry-After while the desktop is not awake or its host is down, after checking the token', async () => {
    const id = await standInDesktop();
    const { url, token } = await expose(alice, id, app.port);
    await sql`UPDATE desktops SET state = 'hibernated' WHERE id = ${id}`;
    expectIngressProblem(await through(url, '/'), 401, 'no token');
    const res = await through(url, '/', { headers: { 'x-svc-token': token! } });
    expectIngressProblem(res, 503);
    expect(Number(res.headers.get('retry-after'))).toBeGreaterThan(0);
    expect(await wsRefusal(url, `/ws?svc_token=${token}`)).toBe(503);
    await sql`UPDATE desktops SET state = 'awake' WHERE id = ${id}`;
    expect((await through(url, '/', { headers: { 'x-svc-token': token! } })).status).toBe(200);
    // A bound route is cached for a moment; the host going down is seen once that passes.
    await sql`UPDATE hosts SET status = 'down' WHERE id = ${standInHost}`;
    try {
      await until(async () => (await through(url, '/', { headers: { 'x-svc-token': token! } })).status === 503, ROUTE_CACHE_TTL_MS + 5_000, '503 once the host is down');
    } finally {
      await sql`UPDATE hosts SET status = 'ready' WHERE id = ${standInHost}`;
    }
  });

  it('answers 404 for a destroyed desktop', async () => {
    const id = await standInDesktop();
    const { url } = await expose(alice, id, app.port, true);
    await sql`UPDATE desktops SET state = 'destroyed' WHERE id = ${id}`;
    expectIngressProblem(await through(url, '/'), 404);
  });

  it.each([
    ['not_running', 503],
    ['unavailable', 503],
    ['refused', 502],
    ['unauthorized', 502],
    ['garbage', 502],
  ] as const)('answers an agent refusal %s with %i', async (mode, status) => {
    const id = await standInDesktop();
    const { url } = await expose(alice, id, app.port, true);
    gateway.mode = mode;
    try {
      const res = await through(url, '/');
      expectIngressProblem(res, status, mode);
      if (status === 503) expect(res.headers.get('retry-after')).not.toBeNull();
      expect(await wsRefusal(url, '/ws')).toBe(status);
    } finally {
      gateway.mode = 'relay';
    }
    expect((await through(url, '/')).status).toBe(200);
  });

  it('answers 503 with Retry-After when the port gateway cannot be reached (the host may be down)', async () => {
    const closed = createTcpServer();
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
    const deadAddress = `127.0.0.1:${(closed.address() as AddressInfo).port}`;
    await new Promise((resolve) => closed.close(resolve));
    const hostId = newId('host');
    await sql`
      INSERT INTO hosts (id, hostname, agent_instance_id, protocol, runtime, memory_snapshots, vcpus, memory_mb, status, cordoned, ingress_address)
      VALUES (${hostId}, 'dead', ${newId('host')}, ${PROTOCOL_VERSION}, 'stand-in', false, 2, 4096, 'ready', true, ${deadAddress})`;
    const id = await standInDesktop();
    await sql`UPDATE desktops SET host_id = ${hostId} WHERE id = ${id}`;
    const { url } = await expose(alice, id, app.port, true);
    const res = await through(url, '/');
    expectIngressProblem(res, 503);
    expect(res.headers.get('retry-after')).toBe('5');
  });

  it('answers 404 for ever after a delete, and closes what the exposure carried', async () => {
    const id = await standInDesktop();
    const { url, token } = await expose(alice, id, app.port);
    expect((await through(url, '/', { headers: { 'x-svc-token': token! } })).status).toBe(200);
    const ws = await openWs(url, `/ws?svc_token=${token}`);
    const wsClosed = new Promise((resolve) => ws.once('close', resolve));
    expect((await alice('DELETE', `/v1/desktops/${id}/ports/${app.port}`)).status).toBe(204);
    await wsClosed;
    expectIngressProblem(await through(url, '/', { headers: { 'x-svc-token': token! } }), 404);
    const recreated = await expose(alice, id, app.port);
    expectIngressProblem(await through(url, '/', { headers: { 'x-svc-token': token! } }), 401, 'the old token');
    expect((await through(url, '/', { headers: { 'x-svc-token': recreated.token! } })).status).toBe(200);
  });

  it('closes what an exposure carried when another replica deletes it, and forgets its route', async () => {
    const id = await standInDesktop();
    const { url } = await expose(alice, id, app.port, true);
    expect((await through(url, '/')).status).toBe(200);
    const ws = await openWs(url, '/ws');
    const wsClosed = new Promise((resolve) => ws.once('close', resolve));
    // What another replica's delete (or a destroy) does: only the row's trigger can tell this one.
    await sql`DELETE FROM port_exposures WHERE desktop_id = ${id} AND port = ${app.port}`;
    const closedInTime = await Promise.race([wsClosed.then(() => true), new Promise((r) => setTimeout(() => r(false), 5_000))]);
    expect(closedInTime, 'the WebSocket is closed').toBe(true);
    // Well inside the route cache's lifetime: the notification dropped the cached route too.
    expectIngressProblem(await through(url, '/'), 404);
  });
});

/* ------------------------------------------------------------------ through a real agent */

describe('the ingress, through an agent on the FakeDriver', () => {
  let agent: TestAgent;
  let desktopId: string;

  beforeAll(async () => {
    agent = await startFakeAgent(s.url);
    const created = await alice('POST', '/v1/desktops', { tier: 'small' });
    desktopId = created.json.id;
    const woke = await alice('POST', `/v1/desktops/${desktopId}/wake?wait=true`);
    expect(woke.json.state, woke.text).toBe('succeeded');
  });

  afterAll(async () => {
    await agent?.stop();
  });

  // Each case starts with no exposures, whatever the one before left behind.
  afterEach(async () => {
    if (desktopId) await sql`DELETE FROM port_exposures WHERE desktop_id = ${desktopId}`;
  });

  it('records the agent port gateway from its hello', async () => {
    const [row] = await sql<Array<{ ingress_address: string | null }>>`SELECT ingress_address FROM hosts WHERE id = ${agent.hostId}`;
    expect(row?.ingress_address).toMatch(/^127\.0\.0\.1:\d+$/);
  });

  it('proxies a private exposure: query and header tokens, Authorization untouched, tokens stripped', async () => {
    const { url, token, status } = await expose(alice, desktopId, app.port);
    expect(status).toBe('bound');
    const viaQuery = await through(url, `/agent?svc_token=${token}&k=v`, { headers: { authorization: 'Bearer app' } });
    expect(viaQuery.status, viaQuery.text).toBe(200);
    expect(viaQuery.json.url).toBe('/agent?k=v');
    expect(viaQuery.json.headers.authorization).toBe('Bearer app');
    const viaHeader = await through(url, '/agent', { headers: { 'x-svc-token': token! } });
    expect(viaHeader.status, viaHeader.text).toBe(200);
    expect(viaHeader.json.headers).not.toHaveProperty('x-svc-token');
    expectIngressProblem(await through(url, '/agent'), 401);
  });

  it('proxies a public exposure, a WebSocket and a 20 MiB body both ways', async () => {
    const { url } = await expose(alice, desktopId, app.port, true);
    expect((await through(url, '/')).status).toBe(200);
    const ws = await openWs(url, '/ws');
    expect(await echo(ws, 'through the agent')).toBe('through the agent');
    ws.close();
    const data = randomBytes(20 * MiB);
    const res = await through(url, '/echo', { method: 'POST', body: data });
    expect(res.status).toBe(200);
    expect(sha(res.body)).toBe(sha(data));
  });

  it('answers 502 when nothing listens on the guest port', async () => {
    const { url } = await expose(alice, desktopId, app.closedPort, true);
    expectIngressProblem(await through(url, '/'), 502);
  });

  it('answers 503 while hibernated, works again after a wake, and 404 for ever after a delete', async () => {
    const { url, token } = await expose(alice, desktopId, app.port);
    const auth = { 'x-svc-token': token! };
    expect((await through(url, '/', { headers: auth })).status).toBe(200);
    const hib = await alice('POST', `/v1/desktops/${desktopId}/hibernate?wait=true`);
    expect(hib.json.state, hib.text).toBe('succeeded');
    const res = await through(url, '/', { headers: auth });
    expectIngressProblem(res, 503, 'hibernated');
    expect(res.headers.get('retry-after')).not.toBeNull();
    expect((await alice('GET', `/v1/desktops/${desktopId}/ports`)).json.ports[0].status).toBe('unbound');
    const woke = await alice('POST', `/v1/desktops/${desktopId}/wake?wait=true`);
    expect(woke.json.state, woke.text).toBe('succeeded');
    expect((await alice('GET', `/v1/desktops/${desktopId}/ports`)).json.ports[0].status).toBe('bound');
    expect((await through(url, '/', { headers: auth })).status).toBe(200);
    expect((await alice('DELETE', `/v1/desktops/${desktopId}/ports/${app.port}`)).status).toBe(204);
    expectIngressProblem(await through(url, '/', { headers: auth }), 404);
    expectIngressProblem(await through(url, '/', { headers: auth }), 404, 'again');
  });

  it('forgets the exposures of a destroyed desktop', async () => {
    const { url } = await expose(alice, desktopId, app.port, true);
    expect((await through(url, '/')).status).toBe(200);
    const gone = await alice('POST', `/v1/desktops/${desktopId}/destroy?wait=true`);
    expect(gone.json.state, gone.text).toBe('succeeded');
    const [row] = await sql<Array<{ n: number }>>`SELECT count(*)::int AS n FROM port_exposures WHERE desktop_id = ${desktopId}`;
    expect(row?.n).toBe(0);
    await until(async () => (await through(url, '/')).status === 404, ROUTE_CACHE_TTL_MS + 5_000, '404 once destroyed');
  });
});

/* ------------------------------------------------------------------ helpers */

interface IngressReply extends ApiResponse {
  body: Buffer;
}

function ingressAddress(): { host: string; port: number } {
  const u = new URL(s.ingressUrl!);
  return { host: u.hostname, port: Number(u.port) };
}

/** One request to the ingress for the exposure at `url` (its host goes in the Host header). */
function through(url: string, path = '/', init: { method?: string; headers?: Record<string, string>; body?: Buffer } = {}): Promise<IngressReply> {
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

function expectIngressProblem(res: IngressReply, status: number, what = ''): void {
  expectProblem(res, status, what);
}

function wsUrl(url: string, path: string): { address: string; host: string } {
  const { host, port } = ingressAddress();
  return { address: `ws://${host}:${port}${path}`, host: new URL(url).host };
}

async function openWs(url: string, path: string): Promise<WebSocket> {
  const { address, host } = wsUrl(url, path);
  const ws = new WebSocket(address, { headers: { host } });
  await new Promise((resolve, reject) => ws.once('open', resolve).once('error', reject).once('unexpected-response', (_req, res) => reject(new Error(`upgrade answered ${res.statusCode}`))));
  return ws;
}

/** The status an upgrade that is refused gets. */
async function wsRefusal(url: string, path: string): Promise<number> {
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

function echo(ws: WebSocket, message: string): Promise<string>;
function echo(ws: WebSocket, message: Buffer, binary: true): Promise<Buffer>;
function echo(ws: WebSocket, message: string | Buffer, binary = false): Promise<string | Buffer> {
  return new Promise((resolve, reject) => {
    ws.once('message', (data: Buffer, isBinary: boolean) => resolve(isBinary ? data : data.toString('utf8')));
    ws.once('error', reject);
    ws.send(message, { binary });
  });
}

interface GuestApp {
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
async function startGuestApp(): Promise<GuestApp> {
  const requests: string[] = [];
  const server: Server = createHttpServer((req, res) => {
    requests.push(req.url ?? '');
    if (req.method === 'POST' && req.url === '/echo') {
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      req.pipe(res);
      return;
    }
    req.resume();
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ method: req.method, url: req.url, headers: req.headers }));
  });
  const wss = new WebSocketServer({ server, maxPayload: 16 * MiB });
  wss.on('connection', (ws) => ws.on('message', (data, isBinary) => ws.send(data, { binary: isBinary })));
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

type GatewayMode = 'relay' | 'not_running' | 'unavailable' | 'refused' | 'unauthorized' | 'garbage';

interface StandInGateway {
  address: string;
  mode: GatewayMode;
  lastTarget: PortTarget | null;
  close(): Promise<void>;
}

/**
 * A port gateway speaking shared/src/port-link.ts: it checks the signed line with the join token
 * and relays to `127.0.0.1:<port>`, or answers as `mode` says.
 */
async function startStandInGateway(key: string): Promise<StandInGateway> {
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
      const target = verifyPortLinkLine(key, buffered.subarray(0, newline).toString('latin1'));
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
