/**
 * Port exposures through the API (docs/api.md §2.9, 4.7), with a real scheduler: list without
 * tokens, create with a token shown once and stored hashed, 400/404/409/501, delete, org
 * isolation down to byte-identical 404 bodies; the port-link key and gateway address of an
 * agent's hello; the ingress settings and host names. The ingress's own answers are in
 * ingress-ports.test.ts; both share test/helpers/ports-fixture.ts.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { newId } from '../../shared/src/ids.js';
import { portLinkKey } from '../../shared/src/port-link.js';
import { PROTOCOL_VERSION } from '../../shared/src/protocol.js';
import { RpcPeer } from '../../shared/src/rpc.js';
import { loadSchedulerConfig } from '../../scheduler/src/config.js';
import { parseExposureHost } from '../../scheduler/src/services/exposure-host.js';
import { withoutTokenParam } from '../../scheduler/src/ingress/port-token.js';
import { api, JOIN_TOKEN, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { expectProblem, type ApiResponse } from '../helpers/problem.js';
import {
  alice, aliceOrg, BASE, bob, expose, s, sha, sql, standInDesktop, standInHost, usePortsWorld, SECRET_KEY, type Call,
} from '../helpers/ports-fixture.js';

usePortsWorld();

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

  it('are off without CANTO_INGRESS_BASE_URL, and default to listening on 0.0.0.0:8081 and holding requests 10 s through a move', () => {
    expect(load({})).toBeNull();
    expect(load({ CANTO_INGRESS_BASE_URL: 'https://Apps.Example.com/' })).toEqual({
      scheme: 'https', domain: 'apps.example.com', urlPort: null, listenHost: '0.0.0.0', listenPort: 8081, moveHoldMs: 10_000,
    });
    expect(load({ CANTO_INGRESS_BASE_URL: 'http://localhost:8081', CANTO_INGRESS_LISTEN: '127.0.0.1:9000', CANTO_INGRESS_MOVE_HOLD_MS: '0' })).toEqual({
      scheme: 'http', domain: 'localhost', urlPort: 8081, listenHost: '127.0.0.1', listenPort: 9000, moveHoldMs: 0,
    });
    expect(() => load({ CANTO_INGRESS_BASE_URL: 'http://localhost:8081', CANTO_INGRESS_MOVE_HOLD_MS: '-1' })).toThrow(/CANTO_INGRESS_MOVE_HOLD_MS/);
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
