/**
 * The ingress of port exposures (docs/api.md §4.7), with a real scheduler:
 *
 * - its own answers, against a stand-in port gateway that speaks shared/src/port-link.ts for a
 *   desktop row made here (404 for unknown hosts and deleted exposures, 401 without the right
 *   token, 503 while unbound, each port-link refusal's status), and proxying through it to a
 *   local HTTP app standing for the guest app: tokens stripped (any one presented may be the
 *   right one), Authorization untouched, a WebSocket echo, a 20 MiB body streamed both ways, and
 *   what a desktop carried closed once its row says it no longer runs there;
 * - the same traffic through a real agent on the FakeDriver, whose port gateway opens
 *   `127.0.0.1:<port>` on the host for the guest port: hibernate answers 503, wake brings the
 *   URL back, delete makes it 404 for good.
 *
 * The API's rules are in api-ports.test.ts; both share test/helpers/ports-fixture.ts.
 */
import { randomBytes } from 'node:crypto';
import { request, type IncomingMessage } from 'node:http';
import { createServer as createTcpServer, type AddressInfo } from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { newId } from '../../shared/src/ids.js';
import { PROTOCOL_VERSION } from '../../shared/src/protocol.js';
import { ROUTE_CACHE_TTL_MS } from '../../scheduler/src/ingress/route-cache.js';
import { until } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import {
  alice, app, BASE, echo, expectIngressProblem, expose, gateway, ingressAddress, MiB, openWs, s, sha, sql, standInDesktop, standInHost, through,
  usePortsWorld, wsRefusal, wsUrl,
} from '../helpers/ports-fixture.js';

usePortsWorld();

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

    // A browser's request for an asset of a page opened with the token names that page in Referer.
    const page = `${url}/page?x=1&svc_token=${encodeURIComponent(token!)}`;
    const asset = await through(url, `/app.js?svc_token=${encodeURIComponent(token!)}`, { headers: { referer: page } });
    expect(asset.status, asset.text).toBe(200);
    expect(asset.json.headers.referer).toBe(`${url}/page?x=1`);
    expect(JSON.stringify(asset.json)).not.toContain(token!);
    // The parameter's name encoded is the same parameter.
    const encoded = await through(url, `/app.js?svc%5Ftoken=${encodeURIComponent(token!)}`, { headers: { referer: `${url}/p?svc%5Ftoken=${encodeURIComponent(token!)}` } });
    expect(encoded.status, encoded.text).toBe(200);
    expect(encoded.json.headers.referer).toBe(`${url}/p`);
  });

  it("keeps an app's cookies on its exposure: a Domain it sets is dropped, over HTTP and on an upgrade", async () => {
    const id = await standInDesktop();
    const { url } = await expose(alice, id, app.port, true);
    const res = await through(url, '/set?cookie=1');
    expect(res.status, res.text).toBe(200);
    expect(res.headers.get('set-cookie')).toBe('s=1; Path=/, plain=2');
    let upgraded: string[] | undefined;
    const ws = await openWs(url, '/ws?cookie=1', (answer) => (upgraded = answer.headers['set-cookie']));
    ws.close();
    expect(upgraded).toEqual(['w=1; Path=/']);
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
      ['a wrong query and a wrong header', `/?svc_token=${other.token}`, { 'x-svc-token': 'svc_pt_wrong' }],
    ] as const) {
      expectIngressProblem(await through(url, path, { headers }), 401, what);
    }
    expect(app.requests).not.toContain('/?svc_token=svc_pt_wrong');
  });

  it('admits a request when any token it presents is right: a stale one beside it hides nothing, over HTTP and on an upgrade', async () => {
    const id = await standInDesktop();
    const { url, token } = await expose(alice, id, app.port);
    const stale = `svc_pt_${'x'.repeat(43)}`;
    for (const [what, path, headers] of [
      ['a right query under a stale header', `/q?svc_token=${token}&k=1`, { 'x-svc-token': stale }],
      ['a right header beside a stale query', `/q?svc_token=${stale}&k=1`, { 'x-svc-token': token! }],
      ['a right parameter after a stale one', `/q?svc_token=${stale}&k=1&svc_token=${token}`, {}],
      ['the eighth token presented', `/q?${Array(6).fill(`svc_token=${stale}`).join('&')}&k=1&svc_token=${token}`, { 'x-svc-token': stale }],
    ] as const) {
      const res = await through(url, path, { headers });
      expect(res.status, `${what}: ${res.text}`).toBe(200);
      expect(res.json.url, what).toBe('/q?k=1');
      expect(JSON.stringify(res.json), what).not.toContain('svc_pt_');
    }
    // Past eight, what a request presents is not looked at: each one costs a hash.
    expectIngressProblem(await through(url, `/q?${Array(8).fill(`svc_token=${stale}`).join('&')}&svc_token=${token}`), 401, 'the ninth');
    const { address, host } = wsUrl(url, `/ws?svc_token=${token}`);
    const ws = new WebSocket(address, { headers: { host, 'x-svc-token': stale } });
    await new Promise((resolve, reject) => ws.once('open', resolve).once('error', reject));
    expect(await echo(ws, 'admitted')).toBe('admitted');
    ws.close();
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

  it('closes what a desktop carried once it no longer runs there, though its host still relays, and not on other changes', async () => {
    for (const change of ['hibernated', 'a new generation'] as const) {
      const id = await standInDesktop(20);
      const { url } = await expose(alice, id, app.port, true);
      const ws = await openWs(url, '/ws');
      const wsClosed = new Promise((resolve) => ws.once('close', resolve));
      // An upload still streaming, which the app echoes as it comes.
      const { host, port } = ingressAddress();
      const upload = request({ host, port, method: 'POST', path: '/echo', agent: false, headers: { host: new URL(url).host, 'transfer-encoding': 'chunked' } });
      upload.on('error', () => {});
      upload.write('first');
      const answer = await new Promise<IncomingMessage>((resolve) => upload.once('response', resolve));
      answer.on('error', () => {});
      expect(await new Promise((resolve) => answer.once('data', (c: Buffer) => resolve(c.toString())))).toBe('first');
      const uploadClosed = new Promise((resolve) => answer.socket.once('close', resolve));
      await sql`UPDATE desktops SET idle_timeout_secs = 61 WHERE id = ${id}`;
      await new Promise((resolve) => setTimeout(resolve, 300));
      expect(await echo(ws, 'still here')).toBe('still here');
      // What host health's force-hibernate writes (or a wake, or a move's commit, on the same host
      // here); the stand-in gateway, like an agent the scheduler cannot reach, still relays.
      if (change === 'hibernated') await sql`UPDATE desktops SET state = 'hibernated', generation = generation + 1 WHERE id = ${id}`;
      else await sql`UPDATE desktops SET generation = generation + 1 WHERE id = ${id}`;
      const cut = Promise.all([wsClosed, uploadClosed]).then(() => true);
      expect(await Promise.race([cut, new Promise((r) => setTimeout(() => r(false), 5_000))]), change).toBe(true);
      expect((await through(url, '/')).status, change).toBe(change === 'hibernated' ? 503 : 200);
    }
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
