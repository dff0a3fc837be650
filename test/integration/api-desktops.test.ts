/**
 * Desktop records through the API (docs/api.md §2.1, 4.1, 4.2, 4.11): the DesktopJson shape, write-only
 * `env`/`setup_script` sealed at rest, list/get/patch, per-org idempotent creation (also under
 * concurrency), and org isolation down to byte-identical 404 bodies.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { api, mintKey, startTestScheduler, type TestScheduler } from '../helpers/scheduler.js';
import { expectProblem } from '../helpers/problem.js';

let s: TestScheduler;
let sql: Sql;
let acme: ReturnType<typeof api>;
let globex: ReturnType<typeof api>;

const ENV_SECRET = 'env-plaintext-4f1d9c2b7a';
const SCRIPT_SECRET = 'echo setup-plaintext-8e3a6b0d51';
const MISSING_DESKTOP = 'dsk_000000000000000000000000';
const MISSING_OPERATION = 'op_000000000000000000000000';

beforeAll(async () => {
  s = await startTestScheduler();
  sql = connectDatabase(s.databaseUrl, { max: 2 });
  acme = api(s.url, await mintKey(s.databaseUrl, 'acme'));
  globex = api(s.url, await mintKey(s.databaseUrl, 'globex'));
});

afterAll(async () => {
  await sql?.end();
  await s?.close();
});

function expectDesktopJson(d: Record<string, unknown>): void {
  expect(Object.keys(d).sort()).toEqual(
    ['billing_mode', 'current_generation_id', 'generation', 'host_id', 'host_status', 'id', 'idle_timeout_secs', 'image_version', 'org_id', 'state', 'tier'],
  );
  expect(d.id).toMatch(/^dsk_[0-9a-v]{24}$/);
  expect(typeof d.org_id).toBe('string');
  expect(['small', 'default', 'large']).toContain(d.tier);
  expect(['provisioning', 'waking', 'awake', 'hibernating', 'hibernated', 'destroyed']).toContain(d.state);
  expect(typeof d.image_version).toBe('string');
  expect(Number.isInteger(d.generation)).toBe(true);
  expect(typeof d.current_generation_id).toBe('string');
  expect(Number.isInteger(d.idle_timeout_secs)).toBe(true);
  expect(['monthly', 'hourly']).toContain(d.billing_mode);
  expect(typeof d.host_id).toBe('string');
}

describe('create, get, list, patch', () => {
  let id: string;

  it('create answers 201 with every DesktopJson field and never echoes env or setup_script', async () => {
    const res = await acme('POST', '/v1/desktops', {
      tier: 'large',
      billing_mode: 'monthly',
      image_version: 'debian-12',
      idle_timeout_secs: 600,
      env: { SECRET_TOKEN: ENV_SECRET, OTHER: 'x' },
      setup_script: SCRIPT_SECRET,
    });
    expect(res.status, res.text).toBe(201);
    expect(res.headers.get('content-type')).toMatch(/^application\/json/);
    expectDesktopJson(res.json);
    expect(res.json).toMatchObject({
      tier: 'large',
      state: 'provisioning',
      image_version: 'debian-12',
      idle_timeout_secs: 600,
      billing_mode: 'monthly',
    });
    expect(res.text).not.toContain(ENV_SECRET);
    expect(res.text).not.toContain('setup-plaintext');
    id = res.json.id;
  });

  it('get and list return the same record, without env or setup_script', async () => {
    const got = await acme('GET', `/v1/desktops/${id}`);
    expect(got.status).toBe(200);
    expectDesktopJson(got.json);
    expect(got.json.id).toBe(id);
    const listed = await acme('GET', '/v1/desktops');
    expect(listed.status).toBe(200);
    expect(Object.keys(listed.json)).toEqual(['desktops']);
    expect(listed.headers.get('content-type')).toBe(got.headers.get('content-type'));
    const mine = listed.json.desktops.find((d: { id: string }) => d.id === id);
    expect(mine).toEqual(got.json);
    // The list is kept serialized between calls (services/desktop-list.ts): a change shows at once.
    const patched = await acme('PATCH', `/v1/desktops/${id}`, { idle_timeout_secs: 42 });
    expect(patched.status).toBe(200);
    const relisted = await acme('GET', '/v1/desktops');
    expect(relisted.json.desktops.find((d: { id: string }) => d.id === id)).toEqual(patched.json);
    await acme('PATCH', `/v1/desktops/${id}`, { idle_timeout_secs: got.json.idle_timeout_secs });
    for (const text of [got.text, listed.text]) {
      expect(text).not.toContain(ENV_SECRET);
      expect(text).not.toContain('setup-plaintext');
      expect(text).not.toMatch(/"env"|"setup_script"/);
    }
  });

  it('env and setup_script are stored sealed, not in plaintext', async () => {
    const [row] = await sql<{ env_sealed: Buffer | null; setup_script_sealed: Buffer | null }[]>`
      SELECT env_sealed, setup_script_sealed FROM desktops WHERE id = ${id}`;
    expect(row?.env_sealed).toBeInstanceOf(Buffer);
    expect(row?.setup_script_sealed).toBeInstanceOf(Buffer);
    for (const sealed of [row!.env_sealed!, row!.setup_script_sealed!]) {
      for (const plain of [ENV_SECRET, SCRIPT_SECRET, 'SECRET_TOKEN', 'setup-plaintext']) {
        expect(sealed.includes(Buffer.from(plain))).toBe(false);
        expect(sealed.toString('latin1')).not.toContain(Buffer.from(plain).toString('base64').slice(0, 12));
      }
    }
    // Nothing else in the row carries them either.
    const [text] = await sql<{ t: string }[]>`SELECT row_to_json(d)::text AS t FROM desktops d WHERE id = ${id}`;
    expect(text!.t).not.toContain(ENV_SECRET);
    expect(text!.t).not.toContain('setup-plaintext');
  });

  it('lists only the caller org, filtered by state', async () => {
    const theirs = await globex('POST', '/v1/desktops', { tier: 'small' });
    expect(theirs.status).toBe(201);
    const all = await acme('GET', '/v1/desktops');
    const ids = all.json.desktops.map((d: { id: string }) => d.id);
    expect(ids).toContain(id);
    expect(ids).not.toContain(theirs.json.id);
    expect(all.json.desktops.every((d: { org_id: string }) => d.org_id === all.json.desktops[0].org_id)).toBe(true);

    const provisioning = await acme('GET', '/v1/desktops?state=provisioning');
    expect(provisioning.status).toBe(200);
    expect(provisioning.json.desktops.map((d: { id: string }) => d.id)).toContain(id);
    expect(provisioning.json.desktops.every((d: { state: string }) => d.state === 'provisioning')).toBe(true);
    for (const state of ['awake', 'hibernated', 'destroyed']) {
      const none = await acme('GET', `/v1/desktops?state=${state}`);
      expect(none.status).toBe(200);
      expect(none.json).toEqual({ desktops: [] });
    }
  });

  it('patch changes idle_timeout_secs and nothing else', async () => {
    const before = (await acme('GET', `/v1/desktops/${id}`)).json;
    const res = await acme('PATCH', `/v1/desktops/${id}`, { idle_timeout_secs: 0 });
    expect(res.status, res.text).toBe(200);
    expect(res.json).toEqual({ ...before, idle_timeout_secs: 0 });
    expect((await acme('GET', `/v1/desktops/${id}`)).json).toEqual(res.json);
    const back = await acme('PATCH', `/v1/desktops/${id}`, { idle_timeout_secs: 3600 });
    expect(back.json.idle_timeout_secs).toBe(3600);
  });
});

describe('Idempotency-Key on create (docs/api.md §4.11)', () => {
  it('the same key in the same org returns the existing desktop with 200 and ignores the new body', async () => {
    const first = await acme('POST', '/v1/desktops', { tier: 'small', idle_timeout_secs: 5 }, { 'idempotency-key': 'create-1' });
    expect(first.status).toBe(201);
    const again = await acme('POST', '/v1/desktops', { tier: 'large', billing_mode: 'monthly' }, { 'idempotency-key': 'create-1' });
    expect(again.status).toBe(200);
    expect(again.json).toEqual(first.json);
    const count = await sql`SELECT 1 FROM desktop_idempotency WHERE key = 'create-1'`;
    expect(count.length).toBe(1);
  });

  it('the same key in another org creates an independent desktop', async () => {
    const ours = await acme('POST', '/v1/desktops', { tier: 'small' }, { 'idempotency-key': 'create-2' });
    const theirs = await globex('POST', '/v1/desktops', { tier: 'small' }, { 'idempotency-key': 'create-2' });
    expect(ours.status).toBe(201);
    expect(theirs.status).toBe(201);
    expect(theirs.json.id).not.toBe(ours.json.id);
    expect(theirs.json.org_id).not.toBe(ours.json.org_id);
  });

  it('a different key creates a different desktop', async () => {
    const a = await acme('POST', '/v1/desktops', { tier: 'small' }, { 'idempotency-key': 'create-3a' });
    const b = await acme('POST', '/v1/desktops', { tier: 'small' }, { 'idempotency-key': 'create-3b' });
    expect([a.status, b.status]).toEqual([201, 201]);
    expect(a.json.id).not.toBe(b.json.id);
  });

  it('five concurrent creates with one key make exactly one desktop', async () => {
    const before = await sql<{ n: number }[]>`SELECT count(*)::int AS n FROM desktops`;
    const results = await Promise.all(
      Array.from({ length: 5 }, () => acme('POST', '/v1/desktops', { tier: 'default' }, { 'idempotency-key': 'race-1' })),
    );
    expect(results.map((r) => r.status).sort()).toEqual([200, 200, 200, 200, 201]);
    expect(new Set(results.map((r) => r.json.id)).size).toBe(1);
    const after = await sql<{ n: number }[]>`SELECT count(*)::int AS n FROM desktops`;
    expect(after[0]!.n - before[0]!.n).toBe(1);
  });
});

describe('org isolation (docs/api.md §1, 5)', () => {
  let theirDesktop: string;
  let theirOperation: string;

  beforeAll(async () => {
    theirDesktop = (await globex('POST', '/v1/desktops', { tier: 'small' })).json.id;
    const wake = await globex('POST', `/v1/desktops/${theirDesktop}/wake`);
    expect(wake.status).toBe(202);
    theirOperation = wake.json.id;
  });

  const routes: Array<[string, string, unknown]> = [
    ['GET', '', undefined],
    ['PATCH', '', { idle_timeout_secs: 1 }],
    ['POST', '/wake', {}],
    ['POST', '/hibernate', {}],
    ['POST', '/destroy', {}],
    ['POST', '/wake?wait=true', { expected_generation: 0 }],
    ['POST', '/fork', { count: 1, acknowledge_shared_state: true }],
  ];

  it.each(routes)('%s /v1/desktops/{other org}%s answers 404 byte-identical to a missing id', async (method, suffix, body) => {
    const theirs = await acme(method, `/v1/desktops/${theirDesktop}${suffix}`, body);
    const missing = await acme(method, `/v1/desktops/${MISSING_DESKTOP}${suffix}`, body);
    expectProblem(theirs, 404, `${method} ${suffix}`);
    expect(theirs.text).toBe(missing.text);
    expect(theirs.headers.get('content-type')).toBe(missing.headers.get('content-type'));
    expect(theirs.headers.get('content-length')).toBe(missing.headers.get('content-length'));
  });

  it("another org's desktop is not in the caller's usage", async () => {
    const usage = await acme('GET', '/v1/usage');
    expect(usage.status).toBe(200);
    expect(usage.json.per_desktop.map((l: { desktop_id: string }) => l.desktop_id)).not.toContain(theirDesktop);
  });

  it("another org's operation answers 404 byte-identical to a missing id", async () => {
    const theirs = await acme('GET', `/v1/operations/${theirOperation}`);
    const missing = await acme('GET', `/v1/operations/${MISSING_OPERATION}`);
    expectProblem(theirs, 404);
    expect(theirs.text).toBe(missing.text);
    expect(theirs.headers.get('content-type')).toBe(missing.headers.get('content-type'));
  });

  it('nothing the other org tried changed their desktop', async () => {
    const d = await globex('GET', `/v1/desktops/${theirDesktop}`);
    expect(d.json).toMatchObject({ state: 'waking', idle_timeout_secs: 0 });
    const ops = await sql`SELECT 1 FROM operations WHERE desktop_id = ${theirDesktop}`;
    expect(ops.length).toBe(1);
    const op = await globex('GET', `/v1/operations/${theirOperation}`);
    expect(op.status).toBe(200);
  });
});

describe('GET /v1/operations/{id} (docs/api.md §4.2)', () => {
  it('returns the Operation of the caller', async () => {
    const id = (await acme('POST', '/v1/desktops', { tier: 'small' })).json.id;
    const wake = await acme('POST', `/v1/desktops/${id}/wake`, undefined, { 'idempotency-key': 'op-get' });
    expect(wake.status).toBe(202);
    const op = await acme('GET', `/v1/operations/${wake.json.id}`);
    expect(op.status).toBe(200);
    expect(op.json).toMatchObject({ id: wake.json.id, desktop_id: id, kind: 'wake', error: null });
    expect(['pending', 'running']).toContain(op.json.state);
    expect(op.json).toHaveProperty('result');
  });

  it.each(['nope', 'op_short', MISSING_DESKTOP, 'OP_000000000000000000000000'])('malformed id %s is 400', async (bad) => {
    expectProblem(await acme('GET', `/v1/operations/${bad}`), 400);
  });

  it('an unknown id is 404', async () => {
    expectProblem(await acme('GET', `/v1/operations/${MISSING_OPERATION}`), 404);
  });
});
