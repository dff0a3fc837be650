/**
 * The webhook endpoint API (docs/api.md §2.10, 2.11, 4.8): registration rules for `url` and `events`,
 * the secret shown once, the per-org cap, org isolation, the delivery log's `limit` and order,
 * and delete cascading to the log. No event reaches these endpoints (no agent, no desktop), so
 * nothing is ever sent to the example hosts registered here.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { newId } from '../../shared/src/ids.js';
import { WEBHOOK_ENDPOINTS_PER_ORG } from '../../scheduler/src/services/webhooks.js';
import { api, mintKey, startTestScheduler, type TestScheduler } from '../helpers/scheduler.js';
import { expectProblem } from '../helpers/problem.js';

type Call = ReturnType<typeof api>;

const ALL_EVENTS = ['desktop.created', 'desktop.woken', 'desktop.hibernated', 'desktop.destroyed'];

let s: TestScheduler;
let sql: Sql;
let alice: Call;
let bob: Call;

beforeAll(async () => {
  s = await startTestScheduler();
  sql = connectDatabase(s.databaseUrl, { max: 2 });
  alice = api(s.url, await mintKey(s.databaseUrl, 'webhooks-alice'));
  bob = api(s.url, await mintKey(s.databaseUrl, 'webhooks-bob'));
});

afterAll(async () => {
  await sql?.end();
  await s?.close();
});

async function register(c: Call, url: string, events: string[] = ['desktop.created']) {
  const res = await c('POST', '/v1/webhooks', { url, events });
  expect(res.status, res.text).toBe(201);
  return res.json;
}

describe('POST /v1/webhooks', () => {
  it('answers 201 with the endpoint and a secret shown only this once', async () => {
    const res = await alice('POST', '/v1/webhooks', { url: 'https://hooks.example.com/canto', events: ALL_EVENTS });
    expect(res.status, res.text).toBe(201);
    expect(res.json).toEqual({
      id: expect.stringMatching(/^whk_[0-9a-v]{24}$/),
      url: 'https://hooks.example.com/canto',
      events: ALL_EVENTS,
      createdAt: expect.any(String),
      secret: expect.stringMatching(/^svc_whsec_[A-Za-z0-9_-]{43}$/),
    });
    expect(new Date(res.json.createdAt).toISOString()).toBe(res.json.createdAt);

    const list = await alice('GET', '/v1/webhooks');
    expect(list.status).toBe(200);
    const listed = list.json.webhooks.find((w: { id: string }) => w.id === res.json.id);
    expect(listed).toEqual({ id: res.json.id, url: res.json.url, events: ALL_EVENTS, createdAt: res.json.createdAt });
    expect(list.text).not.toContain(res.json.secret);
    expect(list.text).not.toContain('secret');
  });

  it('stores the secret sealed, never in plain text', async () => {
    const created = await register(alice, 'https://hooks.example.com/sealed');
    const [row] = await sql<Array<{ secret_sealed: Buffer }>>`SELECT secret_sealed FROM webhook_endpoints WHERE id = ${created.id}`;
    expect(row!.secret_sealed.toString('latin1')).not.toContain(created.secret);
    expect(row!.secret_sealed.toString('latin1')).not.toContain(created.secret.slice('svc_whsec_'.length));
  });

  it('removes duplicate events, keeping the first occurrence order', async () => {
    const created = await register(alice, 'https://hooks.example.com/dupes', ['desktop.woken', 'desktop.created', 'desktop.woken', 'desktop.created']);
    expect(created.events).toEqual(['desktop.woken', 'desktop.created']);
  });

  it.each([
    ['an empty list', []],
    ['an unknown type', ['desktop.exploded']],
    ['one unknown among known ones', ['desktop.created', 'desktop.renamed']],
    ['a non-string', [42]],
    ['not an array', 'desktop.created'],
    ['null', null],
  ])('refuses events that are %s with 400', async (_what, events) => {
    expectProblem(await alice('POST', '/v1/webhooks', { url: 'https://hooks.example.com/x', events }), 400, JSON.stringify(events));
  });

  it('refuses a body without events or without url, a non-string url and malformed JSON with 400', async () => {
    expectProblem(await alice('POST', '/v1/webhooks', { url: 'https://hooks.example.com/x' }), 400, 'no events');
    expectProblem(await alice('POST', '/v1/webhooks', { events: ['desktop.created'] }), 400, 'no url');
    expectProblem(await alice('POST', '/v1/webhooks', { url: 42, events: ['desktop.created'] }), 400, 'numeric url');
    expectProblem(await alice('POST', '/v1/webhooks', '{"url":'), 400, 'malformed JSON');
    expectProblem(await alice('POST', '/v1/webhooks'), 400, 'no body');
  });

  it.each([
    ['plain http', 'http://hooks.example.com/x'],
    ['another scheme', 'ftp://hooks.example.com/x'],
    ['a relative URL', '/hooks/x'],
    ['no URL at all', 'hooks.example.com'],
    ['an empty string', ''],
    ['userinfo with a password', 'https://user:pass@hooks.example.com/x'],
    ['userinfo without a password', 'https://user@hooks.example.com/x'],
    ['an empty userinfo', 'https://@hooks.example.com/x'],
    ['localhost', 'https://localhost/x'],
    ['localhost with a trailing dot', 'https://localhost./x'],
    ['a name under localhost', 'https://api.localhost/x'],
    ['127.0.0.1', 'https://127.0.0.1/x'],
    ['127.0.0.1 with a port', 'https://127.0.0.1:8443/x'],
    ['another 127/8 address', 'https://127.8.9.10/x'],
    ['127.1 (short form)', 'https://127.1/x'],
    ['hex 0x7f000001', 'https://0x7f000001/x'],
    ['decimal 2130706433', 'https://2130706433/x'],
    ['octal 0177.0.0.1', 'https://0177.0.0.1/x'],
    ['::1', 'https://[::1]/x'],
    ['::1 spelled out', 'https://[0:0:0:0:0:0:0:1]/x'],
    ['IPv4-mapped loopback', 'https://[::ffff:127.0.0.1]/x'],
    ['0.0.0.0', 'https://0.0.0.0/x'],
    ['::', 'https://[::]/x'],
    ['the metadata address 169.254.169.254', 'https://169.254.169.254/latest/meta-data'],
    ['IPv4-mapped link-local', 'https://[::ffff:169.254.169.254]/x'],
    ['fe80::1', 'https://[fe80::1]/x'],
    ['fe80::/10 upper edge', 'https://[febf::1]/x'],
  ])('refuses a url with %s with 400', async (_what, url) => {
    expectProblem(await alice('POST', '/v1/webhooks', { url, events: ['desktop.created'] }), 400, url);
  });

  it('accepts a url of exactly 2000 characters and refuses 2001', async () => {
    const base = 'https://hooks.example.com/';
    const exact = base + 'a'.repeat(2000 - base.length);
    expect((await register(alice, exact)).url).toBe(exact);
    expectProblem(await alice('POST', '/v1/webhooks', { url: exact + 'a', events: ['desktop.created'] }), 400, '2001 characters');
  });

  it('accepts public hosts, ports and queries, and returns the normalized URL', async () => {
    expect((await register(alice, 'https://Hooks.Example.COM:8443/a/../b?x=1')).url).toBe('https://hooks.example.com:8443/b?x=1');
    expect((await register(alice, 'https://203.0.113.7/hook')).url).toBe('https://203.0.113.7/hook');
    expect((await register(alice, 'https://[2001:db8::1]/hook')).url).toBe('https://[2001:db8::1]/hook');
  });
});

describe('the per-org endpoint cap', () => {
  it(`allows ${WEBHOOK_ENDPOINTS_PER_ORG} endpoints per org and answers 400 past it`, async () => {
    const carol = api(s.url, await mintKey(s.databaseUrl, 'webhooks-carol'));
    const ids: string[] = [];
    // Concurrent creates must not slip past the cap together.
    const results = await Promise.all(
      Array.from({ length: WEBHOOK_ENDPOINTS_PER_ORG + 3 }, (_, i) => carol('POST', '/v1/webhooks', { url: `https://hooks.example.com/${i}`, events: ['desktop.created'] })),
    );
    for (const res of results) if (res.status === 201) ids.push(res.json.id);
    expect(ids).toHaveLength(WEBHOOK_ENDPOINTS_PER_ORG);
    for (const res of results.filter((r) => r.status !== 201)) {
      expectProblem(res, 400, 'over the cap');
      expect(res.json.detail).toContain(String(WEBHOOK_ENDPOINTS_PER_ORG));
    }
    expect((await carol('GET', '/v1/webhooks')).json.webhooks).toHaveLength(WEBHOOK_ENDPOINTS_PER_ORG);

    // Another org is not affected; a delete frees a slot.
    await register(bob, 'https://hooks.example.com/bob');
    expect((await carol('DELETE', `/v1/webhooks/${ids[0]}`)).status).toBe(204);
    await register(carol, 'https://hooks.example.com/again');
    expectProblem(await carol('POST', '/v1/webhooks', { url: 'https://hooks.example.com/more', events: ['desktop.created'] }), 400);
  });
});

describe('org isolation', () => {
  it("answers 404 for another org's endpoint exactly as for a missing one", async () => {
    const mine = await register(alice, 'https://hooks.example.com/private');
    const gone = await register(bob, 'https://hooks.example.com/gone');
    expect((await bob('DELETE', `/v1/webhooks/${gone.id}`)).status).toBe(204);

    const foreignDelete = await bob('DELETE', `/v1/webhooks/${mine.id}`);
    const missingDelete = await bob('DELETE', `/v1/webhooks/${gone.id}`);
    expectProblem(foreignDelete, 404, 'foreign delete');
    expectProblem(missingDelete, 404, 'missing delete');
    expect(foreignDelete.text).toBe(missingDelete.text);

    const foreignLog = await bob('GET', `/v1/webhooks/${mine.id}/deliveries`);
    const missingLog = await bob('GET', `/v1/webhooks/${gone.id}/deliveries`);
    expectProblem(foreignLog, 404, 'foreign log');
    expect(foreignLog.text).toBe(missingLog.text);

    expect((await bob('GET', '/v1/webhooks')).json.webhooks.map((w: { id: string }) => w.id)).not.toContain(mine.id);
    expect((await alice('GET', `/v1/webhooks/${mine.id}/deliveries`)).status).toBe(200);
  });

  it('answers 404 for ids that cannot exist', async () => {
    for (const id of ['nope', 'whk_short', newId('desktop'), newId('webhook')]) {
      expectProblem(await alice('DELETE', `/v1/webhooks/${id}`), 404, id);
      expectProblem(await alice('GET', `/v1/webhooks/${id}/deliveries`), 404, id);
    }
  });

  it('needs credentials on every webhook route', async () => {
    const anonymous = api(s.url, 'garbage');
    expectProblem(await anonymous('GET', '/v1/webhooks'), 401);
    expectProblem(await anonymous('POST', '/v1/webhooks', { url: 'https://hooks.example.com/x', events: ['desktop.created'] }), 401);
    expectProblem(await anonymous('DELETE', `/v1/webhooks/${newId('webhook')}`), 401);
    expectProblem(await anonymous('GET', `/v1/webhooks/${newId('webhook')}/deliveries`), 401);
  });
});

describe('GET /v1/webhooks/{id}/deliveries', () => {
  let endpoint: any;

  /** Settled log rows written straight to the database (no event is ever sent anywhere). */
  async function seedLog(endpointId: string, orgName: string, count: number): Promise<void> {
    const [org] = await sql<Array<{ id: string }>>`SELECT id FROM orgs WHERE name = ${orgName}`;
    for (let i = 0; i < count; i++) {
      const body = JSON.stringify({ type: 'desktop.created', desktopId: `dsk_${i}`, orgId: org!.id, occurredAt: new Date().toISOString(), data: { n: i } });
      const [event] = await sql<Array<{ id: string }>>`
        INSERT INTO outbox (org_id, desktop_id, type, payload, dispatched_at)
        VALUES (${org!.id}, ${`dsk_${i}`}, 'desktop.created', ${body}::jsonb, now()) RETURNING id`;
      await sql`
        INSERT INTO webhook_deliveries (id, endpoint_id, outbox_id, desktop_id, event_type, body, state, attempts, last_status, next_attempt_at, delivered_at)
        VALUES (${newId('delivery')}, ${endpointId}, ${event!.id}, ${`dsk_${i}`}, 'desktop.created', ${body}, 'delivered', 1, 204, null, now())`;
    }
  }

  beforeAll(async () => {
    endpoint = await register(alice, 'https://hooks.example.com/log');
    await seedLog(endpoint.id, 'webhooks-alice', 205);
  });

  it('returns 50 deliveries by default, newest first, in the documented shape', async () => {
    const res = await alice('GET', `/v1/webhooks/${endpoint.id}/deliveries`);
    expect(res.status, res.text).toBe(200);
    expect(res.json.deliveries).toHaveLength(50);
    expect(res.json.deliveries.map((d: any) => d.payload.data.n)).toEqual(Array.from({ length: 50 }, (_, i) => 204 - i));
    expect(res.json.deliveries[0]).toEqual({
      id: expect.stringMatching(/^dlv_[0-9a-v]{24}$/),
      eventType: 'desktop.created',
      state: 'delivered',
      attempts: 1,
      lastStatus: 204,
      lastError: null,
      nextAttemptAt: null,
      payload: { type: 'desktop.created', desktopId: 'dsk_204', orgId: expect.any(String), occurredAt: expect.any(String), data: { n: 204 } },
      createdAt: expect.any(String),
      deliveredAt: expect.any(String),
    });
  });

  it('honours limit from 1 to 200', async () => {
    expect((await alice('GET', `/v1/webhooks/${endpoint.id}/deliveries?limit=1`)).json.deliveries).toHaveLength(1);
    expect((await alice('GET', `/v1/webhooks/${endpoint.id}/deliveries?limit=200`)).json.deliveries).toHaveLength(200);
    expect((await alice('GET', `/v1/webhooks/${endpoint.id}/deliveries?limit=007`)).json.deliveries).toHaveLength(7);
  });

  it.each(['abc', '', '0', '201', '-1', '1.5', '1e2', '+5', ' 5', '99999999999999999999'])('answers 400 for limit=%j', async (limit) => {
    expectProblem(await alice('GET', `/v1/webhooks/${endpoint.id}/deliveries?limit=${encodeURIComponent(limit)}`), 400, `limit=${limit}`);
  });

  it('is empty for a new endpoint', async () => {
    const fresh = await register(alice, 'https://hooks.example.com/fresh');
    expect((await alice('GET', `/v1/webhooks/${fresh.id}/deliveries`)).json).toEqual({ deliveries: [] });
  });
});

describe('DELETE /v1/webhooks/{id}', () => {
  it('answers 204, removes the endpoint and cascades its delivery log', async () => {
    const endpoint = await register(alice, 'https://hooks.example.com/doomed');
    const [org] = await sql<Array<{ id: string }>>`SELECT id FROM orgs WHERE name = 'webhooks-alice'`;
    const [event] = await sql<Array<{ id: string }>>`
      INSERT INTO outbox (org_id, desktop_id, type, payload, dispatched_at) VALUES (${org!.id}, 'dsk_x', 'desktop.created', '{}'::jsonb, now()) RETURNING id`;
    await sql`
      INSERT INTO webhook_deliveries (id, endpoint_id, outbox_id, desktop_id, event_type, body, state, next_attempt_at)
      VALUES (${newId('delivery')}, ${endpoint.id}, ${event!.id}, 'dsk_x', 'desktop.created', '{}', 'failed', null)`;

    const res = await alice('DELETE', `/v1/webhooks/${endpoint.id}`);
    expect(res.status, res.text).toBe(204);
    expect(res.text).toBe('');
    expect((await alice('GET', '/v1/webhooks')).json.webhooks.map((w: { id: string }) => w.id)).not.toContain(endpoint.id);
    expectProblem(await alice('GET', `/v1/webhooks/${endpoint.id}/deliveries`), 404);
    expectProblem(await alice('DELETE', `/v1/webhooks/${endpoint.id}`), 404, 'second delete');
    const [left] = await sql<Array<{ n: number }>>`SELECT count(*)::int AS n FROM webhook_deliveries WHERE endpoint_id = ${endpoint.id}`;
    expect(left!.n).toBe(0);
  });
});
