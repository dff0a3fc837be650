/**
 * The admin API (`/admin/v1`) on two replicas of one database, with fake agents over real
 * websockets: only the admin token opens it (org keys, JWT-shaped and garbage tokens get 401
 * problem+json on every route; a replica without a token answers 503); hosts are listed with
 * the numbers placement uses, cordoned (placement then skips them), uncordoned and removed only
 * once empty and their agent is gone; orgs and keys are administered, and a key revoked through
 * one replica is refused by the other within a second. The admin API has its own valid OpenAPI
 * 3.1 document and stays out of the `/v1` one.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Validator } from '@seriousme/openapi-schema-validator';
import { loadSchedulerConfig } from '../../scheduler/src/config.js';
import { api, mintKey, readResponse, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { expectProblem } from '../helpers/problem.js';
import { connectDatabase } from '../../scheduler/src/store/db.js';

const ADMIN_TOKEN = 'test-admin-token-0123456789abcdefghijklmnop';
const FAST_HEALTH = { CANTO_HEARTBEAT_MS: '200', CANTO_ADMIN_TOKEN: ADMIN_TOKEN };
const MISSING_HOST = 'host_000000000000000000000000';
const MISSING_ORG = 'org_000000000000000000000000';
const MISSING_KEY = 'key_000000000000000000000000';

let a: TestScheduler;
let b: TestScheduler;
let acmeKey: string;
const agents: TestAgent[] = [];

/** A call to `base` with `authorization` as given (undefined: no header). */
function call(base: string, authorization: string | undefined) {
  return async (method: string, path: string, body?: unknown) => {
    const headers: Record<string, string> = {};
    if (authorization !== undefined) headers.authorization = authorization;
    if (body !== undefined) headers['content-type'] = 'application/json';
    return readResponse(await fetch(base + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) }));
  };
}

beforeAll(async () => {
  a = await startTestScheduler(FAST_HEALTH);
  b = await startTestScheduler(FAST_HEALTH, a.databaseUrl);
  acmeKey = await mintKey(a.databaseUrl, 'acme');
  for (let i = 0; i < 2; i++) agents.push(await startFakeAgent(a.url));
});

afterAll(async () => {
  for (const agent of agents) await agent.stop();
  await b?.close();
  await a?.close();
});

const adminA = () => call(a.url, `Bearer ${ADMIN_TOKEN}`);

describe('admin authentication', () => {
  const ROUTES: Array<[string, string]> = [
    ['GET', '/admin/v1/hosts'],
    ['GET', `/admin/v1/hosts/${MISSING_HOST}`],
    ['POST', `/admin/v1/hosts/${MISSING_HOST}/cordon`],
    ['POST', `/admin/v1/hosts/${MISSING_HOST}/uncordon`],
    ['DELETE', `/admin/v1/hosts/${MISSING_HOST}`],
    ['GET', '/admin/v1/orgs'],
    ['POST', '/admin/v1/orgs'],
    ['GET', `/admin/v1/orgs/${MISSING_ORG}/keys`],
    ['POST', `/admin/v1/orgs/${MISSING_ORG}/keys`],
    ['DELETE', `/admin/v1/orgs/${MISSING_ORG}/keys/${MISSING_KEY}`],
    ['POST', `/admin/v1/hosts/${MISSING_HOST}/drain`],
    ['POST', `/admin/v1/hosts/${MISSING_HOST}/forget`],
    ['POST', `/admin/v1/hosts/${MISSING_HOST}/reset-key`],
    ['POST', '/admin/v1/desktops/dsk_000000000000000000000000/move'],
    ['GET', '/admin/v1/desktops'],
    ['GET', '/admin/v1/desktops/dsk_000000000000000000000000'],
    ['GET', '/admin/v1/operations/op_000000000000000000000000'],
  ];
  const jwtShaped = 'eyJhbGciOiJSUzI1NiJ9.eyJvcmdfaWQiOiJhY21lIn0.c2lnbmF0dXJl';

  it('is 401 problem+json on every route for a missing, garbage, org-key or JWT-shaped credential', async () => {
    const credentials: Record<string, string | undefined> = {
      missing: undefined,
      garbage: 'Bearer garbage',
      'org key': `Bearer ${acmeKey}`,
      'JWT-shaped bearer': `Bearer ${jwtShaped}`,
      'the token one character off': `Bearer ${ADMIN_TOKEN.slice(0, -1)}x`,
      'the token in another scheme': `Basic ${ADMIN_TOKEN}`,
    };
    for (const [what, authorization] of Object.entries(credentials)) {
      for (const [method, path] of ROUTES) {
        const res = await call(a.url, authorization)(method, path, method === 'POST' ? {} : undefined);
        expectProblem(res, 401, `${what}: ${method} ${path}`);
      }
    }
  });

  it('does not let the admin token act as an org credential on /v1', async () => {
    expectProblem(await adminA()('GET', '/v1/desktops'), 401);
  });

  it('answers 503 with how to turn it on, on a replica without a token; /v1 still works there', async () => {
    // A database of its own: the fake agents of this file do not link to it (their links to a
    // replica that starts and stops here only added timing to what is tested).
    const off = await startTestScheduler({});
    const offKey = await mintKey(off.databaseUrl, 'acme');
    try {
      for (const [method, path] of ROUTES) {
        const res = await call(off.url, `Bearer ${ADMIN_TOKEN}`)(method, path, method === 'POST' ? {} : undefined);
        expectProblem(res, 503, `${method} ${path}`);
        expect(res.json.detail).toContain('CANTO_ADMIN_TOKEN');
      }
      expect((await api(off.url, offKey)('GET', '/v1/desktops')).status).toBe(200);
      expect((await fetch(`${off.url}/admin/v1/openapi.json`)).status).toBe(200);
    } finally {
      await off.close();
    }
  });

  it('refuses a token shorter than 32 characters at start-up, saying so', () => {
    const base = { DATABASE_URL: a.databaseUrl, CANTO_SECRET_KEY: a.env.CANTO_SECRET_KEY! };
    expect(() => loadSchedulerConfig({ ...base, CANTO_ADMIN_TOKEN: 'short-token' })).toThrow(/CANTO_ADMIN_TOKEN must be at least 32/);
    expect(() => loadSchedulerConfig({ ...base, CANTO_ADMIN_TOKEN: `${'x'.repeat(32)} y` })).toThrow(/without spaces/);
    expect(loadSchedulerConfig({ ...base, CANTO_ADMIN_TOKEN: ADMIN_TOKEN }).adminToken).toBe(ADMIN_TOKEN);
    expect(loadSchedulerConfig(base).adminToken).toBeNull();
  });
});

describe('hosts', () => {
  const admin = () => adminA();
  const acme = () => api(a.url, acmeKey);

  it('lists every host with state, capacity and use, desktops by state and its agent', async () => {
    // A host reads ready once its agent has applied its hello fence, just after it links.
    await until(async () => ((await admin()('GET', '/admin/v1/hosts')).json.hosts as any[]).every((h) => h.state === 'ready'), 10_000, 'hosts ready');
    const res = await admin()('GET', '/admin/v1/hosts');
    expect(res.status).toBe(200);
    const hosts = res.json.hosts as any[];
    expect(hosts.map((h) => h.id).sort()).toEqual(agents.map((x) => x.hostId).sort());
    for (const h of hosts) {
      expect(h).toMatchObject({
        state: 'ready', linked: true, cordoned: false, schedulable: true,
        // Where the ingress dials its port gateway: the address it gives, and the port it took.
        address: expect.stringMatching(/^127\.0\.0\.1:[1-9]\d*$/),
        agent: { protocol: expect.stringMatching(/^\d+\.\d+$/), runtime: 'fake', memory_snapshots: expect.any(Boolean), instance_id: expect.any(String) },
        used: { vcpus: 0, memory_mb: 0, slots: 0 },
        desktops: { provisioning: 0, waking: 0, awake: 0, hibernating: 0, hibernated: 0, total: 0 },
      });
      // Placement's nominal limits: no CPU or memory cap by default (overcommit 0), 2048 slots.
      expect(h.capacity).toEqual({ vcpus: null, memory_mb: null, slots: 2048 });
      // What the agent measured, and the memory placement keeps free (10 % of the reported memory).
      await until(async () => (await admin()('GET', `/admin/v1/hosts/${h.id}`)).json.measured !== null, 10_000, 'a measured heartbeat');
      const measured = (await admin()('GET', `/admin/v1/hosts/${h.id}`)).json;
      expect(measured.measured).toMatchObject({ running_desktops: 0, desktops_memory_mb: 0, memory_available_mb: expect.any(Number), cpu_busy: expect.any(Number) });
      expect(measured.measured.memory_available_mb).toBeGreaterThan(0);
      expect(measured.memory.reserve_mb).toBe(Math.ceil(h.reported.memory_mb / 10));
      expect(measured.memory.room_mb).toBe(Math.max(0, measured.measured.memory_available_mb - measured.memory.reserve_mb));
      expect(Date.parse(h.last_heartbeat_at)).toBeGreaterThan(Date.now() - 60_000);
      expect(typeof h.hostname).toBe('string');
    }
    // Each agent is linked to both replicas, as both recorded it (within a registry refresh).
    await until(async () => ((await admin()('GET', '/admin/v1/hosts')).json.hosts as any[]).every((h) => h.links.linked.length === 2), 5_000, 'links recorded');
    const sql = connectDatabase(a.databaseUrl, { max: 1 });
    const replicas = (await sql<Array<{ id: string }>>`SELECT id FROM replicas ORDER BY id`).map((r) => r.id);
    const [lease] = await sql<Array<{ holder: string }>>`SELECT holder FROM leases WHERE name = 'leader'`;
    await sql.end();
    for (const h of (await admin()('GET', '/admin/v1/hosts')).json.hosts as any[]) {
      expect({ ...h.links, linked: [...h.links.linked].sort() }).toEqual({ linked: replicas, unlinked: [], settling: [], leader: lease!.holder, leader_linked: true });
    }
  });

  it('shows one host; 404 for an unknown one, 400 naming the field for a malformed id', async () => {
    const one = await call(b.url, `Bearer ${ADMIN_TOKEN}`)('GET', `/admin/v1/hosts/${agents[0]!.hostId}`);
    expect(one.status).toBe(200);
    expect(one.json.id).toBe(agents[0]!.hostId);
    expectProblem(await admin()('GET', `/admin/v1/hosts/${MISSING_HOST}`), 404);
    const bad = await admin()('GET', '/admin/v1/hosts/nope');
    expectProblem(bad, 400);
    expect(bad.json.detail).toContain('params/host_id');
  });

  it('cordons idempotently; a cordoned host gets no new desktop; uncordon lets placement use it again', async () => {
    const [first, second] = [agents[0]!.hostId, agents[1]!.hostId];
    for (let i = 0; i < 2; i++) {
      const res = await admin()('POST', `/admin/v1/hosts/${first}/cordon`);
      expect(res.status).toBe(200);
      expect(res.json).toMatchObject({ id: first, cordoned: true, schedulable: false });
    }
    const extra = await admin()('POST', `/admin/v1/hosts/${first}/cordon`, { force: true });
    expectProblem(extra, 400);
    expect(extra.json.detail).toContain('body/force');

    const ids = await Promise.all([0, 1, 2].map(async () => (await acme()('POST', '/v1/desktops', { tier: 'small' })).json.id as string));
    const placed: any[] = await until(async () => {
      const all = await Promise.all(ids.map(async (id) => (await acme()('GET', `/v1/desktops/${id}`)).json));
      return all.every((d) => d.state === 'hibernated') ? all : null;
    }, 15_000, 'the desktops placed');
    expect(placed.map((d) => d.host_id)).toEqual([second, second, second]);
    const shown = (await admin()('GET', `/admin/v1/hosts/${second}`)).json;
    expect(shown.desktops).toMatchObject({ hibernated: 3, total: 3 });
    expect(shown.used).toEqual({ vcpus: 0, memory_mb: 0, slots: 3 });

    for (let i = 0; i < 2; i++) {
      const res = await admin()('POST', `/admin/v1/hosts/${first}/uncordon`, {});
      expect(res.json).toMatchObject({ cordoned: false, schedulable: true });
    }
    expectProblem(await admin()('POST', `/admin/v1/hosts/${MISSING_HOST}/cordon`), 404);
  });

  it('removes a host only when it holds no desktop and its agent is gone', async () => {
    const [first, second] = [agents[0]!.hostId, agents[1]!.hostId];
    const holds = await admin()('DELETE', `/admin/v1/hosts/${second}`);
    expectProblem(holds, 409);
    expect(holds.json.detail).toMatch(/holds 3 desktop/);
    const linked = await admin()('DELETE', `/admin/v1/hosts/${first}`);
    expectProblem(linked, 409);
    expect(linked.json.detail).toMatch(/agent is still connected/);

    // The second host's desktops are destroyed: destroyed desktops do not hold it.
    const listed = (await acme()('GET', '/v1/desktops')).json;
    const mine = listed.desktops as any[];
    for (const d of mine.filter((x) => x.host_id === second)) {
      expect((await acme()('POST', `/v1/desktops/${d.id}/destroy?wait=true`)).status).toBe(200);
    }
    for (const agent of agents.splice(0)) await agent.stop();
    await until(async () => {
      const hosts = (await admin()('GET', '/admin/v1/hosts')).json.hosts as any[];
      return hosts.every((h) => h.state === 'down' && !h.linked);
    }, 10_000, 'both hosts down');
    for (const id of [first, second]) {
      const res = await admin()('DELETE', `/admin/v1/hosts/${id}`);
      expect(res.status, res.text).toBe(204);
      expectProblem(await admin()('GET', `/admin/v1/hosts/${id}`), 404);
    }
    expect((await admin()('GET', '/admin/v1/hosts')).json.hosts).toEqual([]);
    expectProblem(await admin()('DELETE', `/admin/v1/hosts/${first}`), 404);
  });
});

describe('orgs and keys', () => {
  const admin = () => adminA();

  it('creates an org once, and names the field of a bad body', async () => {
    const created = await admin()('POST', '/admin/v1/orgs', { name: 'initech' });
    expect(created.status).toBe(201);
    expect(created.json).toMatchObject({ id: expect.stringMatching(/^org_/), name: 'initech', key_count: 0, desktop_count: 0 });
    expectProblem(await admin()('POST', '/admin/v1/orgs', { name: 'initech' }), 409);
    for (const [body, field] of [[{}, 'body/name'], [{ name: '' }, 'body/name'], [{ name: ' padded' }, 'body/name'], [{ name: 'x', plan: 'gold' }, 'body/plan']] as const) {
      const res = await admin()('POST', '/admin/v1/orgs', body);
      expectProblem(res, 400, JSON.stringify(body));
      expect(res.json.detail).toContain(field);
    }
    const orgs = (await admin()('GET', '/admin/v1/orgs')).json.orgs as any[];
    expect(orgs.find((o) => o.name === 'initech')).toMatchObject({ key_count: 0, desktop_count: 0 });
    expect(orgs.find((o) => o.name === 'acme')).toMatchObject({ key_count: 1 });
  });

  it("creates, lists and revokes an org's keys; a key revoked on one replica is refused by the other within a second", async () => {
    const org = ((await admin()('GET', '/admin/v1/orgs')).json.orgs as any[]).find((o) => o.name === 'initech');
    const created = await admin()('POST', `/admin/v1/orgs/${org.id}/keys`, { name: 'ci' });
    expect(created.status).toBe(201);
    expect(created.json).toMatchObject({ id: expect.stringMatching(/^key_/), name: 'ci', key: expect.stringMatching(/^svc_sk_/) });
    expect(created.json.prefix).toBe(created.json.key.slice(0, created.json.prefix.length));
    const unnamed = await admin()('POST', `/admin/v1/orgs/${org.id}/keys`);
    expect(unnamed.status).toBe(201);
    expect(unnamed.json.name).toBeNull();

    const listed = (await admin()('GET', `/admin/v1/orgs/${org.id}/keys`)).json.keys as any[];
    expect(listed.map((k) => k.id).sort()).toEqual([created.json.id, unnamed.json.id].sort());
    for (const k of listed) expect(Object.keys(k).sort()).toEqual(['created_at', 'id', 'last_used_at', 'name', 'prefix']);

    const key: string = created.json.key;
    expect((await api(a.url, key)('GET', '/v1/desktops')).status).toBe(200);
    expect((await api(b.url, key)('GET', '/v1/desktops')).status).toBe(200);
    const revoked = await admin()('DELETE', `/admin/v1/orgs/${org.id}/keys/${created.json.id}`);
    expect(revoked.status).toBe(204);
    const at = Date.now();
    await until(async () => (await api(b.url, key)('GET', '/v1/desktops')).status === 401, 1_000, 'the other replica to refuse the key');
    expect(Date.now() - at).toBeLessThan(1_000);
    expectProblem(await api(a.url, key)('GET', '/v1/desktops'), 401);
    expect((await api(b.url, unnamed.json.key)('GET', '/v1/desktops')).status).toBe(200);

    expectProblem(await admin()('DELETE', `/admin/v1/orgs/${org.id}/keys/${created.json.id}`), 404);
    expect(((await admin()('GET', '/admin/v1/orgs')).json.orgs as any[]).find((o) => o.id === org.id).key_count).toBe(1);
  });

  it('answers 404 for an unknown org, 400 naming the field for malformed ids and bodies', async () => {
    const org = ((await admin()('GET', '/admin/v1/orgs')).json.orgs as any[]).find((o) => o.name === 'acme');
    expectProblem(await admin()('GET', `/admin/v1/orgs/${MISSING_ORG}/keys`), 404);
    expectProblem(await admin()('POST', `/admin/v1/orgs/${MISSING_ORG}/keys`, {}), 404);
    expectProblem(await admin()('DELETE', `/admin/v1/orgs/${MISSING_ORG}/keys/${MISSING_KEY}`), 404);
    expectProblem(await admin()('DELETE', `/admin/v1/orgs/${org.id}/keys/${MISSING_KEY}`), 404);
    const badOrg = await admin()('GET', '/admin/v1/orgs/acme/keys');
    expectProblem(badOrg, 400);
    expect(badOrg.json.detail).toContain('params/org_id');
    const badKey = await admin()('DELETE', `/admin/v1/orgs/${org.id}/keys/nope`);
    expect(badKey.json.detail).toContain('params/key_id');
    const extra = await admin()('POST', `/admin/v1/orgs/${org.id}/keys`, { name: 'x', scopes: ['all'] });
    expectProblem(extra, 400);
    expect(extra.json.detail).toContain('body/scopes');
    const long = await admin()('POST', `/admin/v1/orgs/${org.id}/keys`, { name: 'x'.repeat(101) });
    expect(long.json.detail).toContain('body/name');
  });
});

describe('OpenAPI documents', () => {
  const ADMIN_OPERATIONS: Record<string, Record<string, number[]>> = {
    '/admin/v1/hosts': { get: [401] },
    '/admin/v1/hosts/{host_id}': { get: [400, 401, 404], delete: [400, 401, 404, 409] },
    '/admin/v1/hosts/{host_id}/cordon': { post: [400, 401, 404] },
    '/admin/v1/hosts/{host_id}/uncordon': { post: [400, 401, 404] },
    '/admin/v1/orgs': { get: [401], post: [400, 401, 409] },
    '/admin/v1/orgs/{org_id}/keys': { get: [400, 401, 404], post: [400, 401, 404] },
    '/admin/v1/orgs/{org_id}/keys/{key_id}': { delete: [400, 401, 404] },
    '/admin/v1/hosts/{host_id}/drain': { post: [400, 401, 404, 409] },
    '/admin/v1/hosts/{host_id}/forget': { post: [400, 401, 404, 409] },
    '/admin/v1/hosts/{host_id}/reset-key': { post: [400, 401, 404] },
    '/admin/v1/desktops/{desktop_id}/move': { post: [400, 401, 404, 409] },
    '/admin/v1/desktops': { get: [400, 401] },
    '/admin/v1/desktops/{desktop_id}': { get: [400, 401, 404] },
    '/admin/v1/operations/{operation_id}': { get: [400, 401, 404] },
  };

  it('serves the admin API its own valid OpenAPI 3.1 document, without credentials', async () => {
    const res = await fetch(`${b.url}/admin/v1/openapi.json`);
    expect(res.status).toBe(200);
    const doc: any = await res.json();
    expect(doc.openapi).toMatch(/^3\.1\.\d+$/);
    const result = await new Validator().validate(doc);
    if (!result.valid) console.error(JSON.stringify(result.errors, null, 2));
    expect(result.valid).toBe(true);
    expect(doc.components.securitySchemes.admin_token).toMatchObject({ type: 'http', scheme: 'bearer' });
    expect(doc.security).toEqual([{ admin_token: [] }]);
    expect(Object.keys(doc.paths).sort()).toEqual([...Object.keys(ADMIN_OPERATIONS), '/admin/v1/openapi.json'].sort());
    // None of the /v1 schemas every replica shares.
    expect(Object.keys(doc.components.schemas ?? {}).filter((name) => name !== 'Problem')).toEqual([]);

    const ids = new Set<string>();
    for (const [path, methods] of Object.entries(ADMIN_OPERATIONS)) {
      for (const [method, statuses] of Object.entries(methods)) {
        const op = doc.paths[path][method];
        expect(op, `${method} ${path}`).toBeDefined();
        expect(op.operationId).toMatch(/^[a-z][A-Za-z]+$/);
        ids.add(op.operationId);
        expect(op.tags?.length, `${method} ${path} tags`).toBe(1);
        for (const status of [...statuses, 500, 503]) {
          expect(Object.keys(op.responses[status]?.content ?? {}), `${method} ${path} ${status}`).toEqual(['application/problem+json']);
        }
      }
    }
    expect(ids.size).toBe(17);
    expect(doc.paths['/admin/v1/orgs'].post.requestBody.required).toBe(true);
    expect(doc.paths['/admin/v1/orgs/{org_id}/keys'].post.requestBody.required).toBe(false);
    expect(doc.paths['/admin/v1/openapi.json'].get.security).toEqual([]);
  });

  it('keeps every admin route out of the /v1 document', async () => {
    const doc: any = await (await fetch(`${a.url}/v1/openapi.json`)).json();
    expect(Object.keys(doc.paths).filter((p) => p.startsWith('/admin'))).toEqual([]);
    expect(JSON.stringify(doc)).not.toMatch(/cordon|admin_token|listOrgs/);
  });
});
