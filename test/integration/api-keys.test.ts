/**
 * API keys through the API (docs/api.md §4.10, 5): `POST /v1/keys` creates a key in the caller's org,
 * shown once and stored hashed; `GET /v1/keys` lists the org's keys without secrets; `DELETE
 * /v1/keys/{id}` revokes one, refused at once by every replica. Another org's key answers exactly
 * like a missing one; no credential is 401.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { api, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { expectProblem } from '../helpers/problem.js';

let s: TestScheduler;
let follower: TestScheduler;
let sql: Sql;
let alice: ReturnType<typeof api>;
let bob: ReturnType<typeof api>;

beforeAll(async () => {
  s = await startTestScheduler();
  follower = await startTestScheduler({ CANTO_SECRET_KEY: s.env.CANTO_SECRET_KEY! }, s.databaseUrl);
  sql = connectDatabase(s.databaseUrl, { max: 1 });
  alice = api(s.url, await mintKey(s.databaseUrl, 'keys-alice'));
  bob = api(s.url, await mintKey(s.databaseUrl, 'keys-bob'));
});

afterAll(async () => {
  await sql?.end();
  await Promise.all([follower?.close(), s?.close()]);
});

describe('API keys', () => {
  it('answers 401 without a credential, on every key route', async () => {
    for (const [method, path] of [['POST', '/v1/keys'], ['GET', '/v1/keys'], ['DELETE', '/v1/keys/key_0000000000000000000000aa']] as const) {
      const res = await fetch(s.url + path, { method, headers: { 'content-type': 'application/json' }, body: method === 'POST' ? '{}' : undefined });
      expect(res.status, `${method} ${path}`).toBe(401);
      expect(res.headers.get('content-type')).toMatch(/^application\/problem\+json/);
    }
  });

  it('creates a key shown once, stored hashed, that works at once on every replica', async () => {
    const created = await alice('POST', '/v1/keys', { name: 'ci runner' });
    expect(created.status, created.text).toBe(201);
    const key: string = created.json.key;
    expect(key).toMatch(/^svc_sk_[A-Za-z0-9_-]{43}$/);
    expect(created.json).toMatchObject({ id: expect.stringMatching(/^key_[0-9a-v]{24}$/), name: 'ci runner', prefix: key.slice(0, 12), last_used_at: null });
    const [row] = await sql`SELECT token_hash, prefix FROM api_keys WHERE id = ${created.json.id}`;
    expect(row!.token_hash).toMatch(/^[0-9a-f]{64}$/);
    expect(JSON.stringify(row)).not.toContain(key);

    for (const replica of [s, follower]) {
      const res = await api(replica.url, key)('GET', '/v1/desktops');
      expect(res.status).toBe(200);
    }
    // The new key belongs to the creator's org.
    const desktop = await api(s.url, key)('POST', '/v1/desktops', { tier: 'small' });
    expect((await alice('GET', `/v1/desktops/${desktop.json.id}`)).status).toBe(200);

    const listed = await alice('GET', '/v1/keys');
    expect(listed.status).toBe(200);
    expect(listed.text).not.toContain(key);
    const mine = listed.json.keys.find((k: { id: string }) => k.id === created.json.id);
    expect(Object.keys(mine).sort()).toEqual(['created_at', 'id', 'last_used_at', 'name', 'prefix']);
    expect(mine.last_used_at).not.toBeNull();
    // The org's other key (minted before names and prefixes were kept by this route) is listed too.
    expect(listed.json.keys).toHaveLength(2);
  });

  it('revokes a key: every replica refuses it from its next request', async () => {
    const created = (await alice('POST', '/v1/keys', {})).json;
    expect(created.name).toBeNull();
    const onFollower = api(follower.url, created.key);
    expect((await onFollower('GET', '/v1/keys')).status).toBe(200);
    const revoked = await alice('DELETE', `/v1/keys/${created.id}`);
    expect(revoked.status).toBe(204);
    await until(async () => (await onFollower('GET', '/v1/keys')).status === 401, 1_000, 'the follower to refuse the revoked key');
    expect((await api(s.url, created.key)('GET', '/v1/keys')).status).toBe(401);
    expect((await alice('GET', '/v1/keys')).json.keys.map((k: { id: string }) => k.id)).not.toContain(created.id);
    expectProblem(await alice('DELETE', `/v1/keys/${created.id}`), 404);
  });

  it("answers another org's key exactly like a missing one", async () => {
    const bobs = (await bob('POST', '/v1/keys', { name: 'bob' })).json;
    const other = await alice('DELETE', `/v1/keys/${bobs.id}`);
    const missing = await alice('DELETE', '/v1/keys/key_0000000000000000000000aa');
    const malformed = await alice('DELETE', '/v1/keys/nope');
    expectProblem(other, 404);
    expect(other.text).toBe(missing.text);
    expect(malformed.text).toBe(missing.text);
    expect((await alice('GET', '/v1/keys')).json.keys.map((k: { id: string }) => k.id)).not.toContain(bobs.id);
    expect((await api(s.url, bobs.key)('GET', '/v1/keys')).status).toBe(200);
  });

  it('refuses a name that is empty, too long or not a string', async () => {
    for (const name of ['', 'x'.repeat(101), 7]) expectProblem(await alice('POST', '/v1/keys', { name }), 400, JSON.stringify(name));
  });

  it('records last use without emptying the key caches of the replicas', async () => {
    const created = (await alice('POST', '/v1/keys', { name: 'quiet' })).json;
    const heard: string[] = [];
    const listener = connectDatabase(s.databaseUrl, { max: 1 });
    try {
      await listener.listen('canto_api_key_changed', (payload) => heard.push(payload));
      expect((await api(s.url, created.key)('GET', '/v1/keys')).status).toBe(200);
      await until(async () => (await sql`SELECT last_used_at FROM api_keys WHERE id = ${created.id}`)[0]!.last_used_at !== null, 2_000, 'last use recorded');
      await new Promise((r) => setTimeout(r, 200));
      expect(heard).toEqual([]);
    } finally {
      await listener.end();
    }
  });

  it('is in the OpenAPI document', async () => {
    const doc = (await alice('GET', '/v1/openapi.json')).json;
    expect(Object.keys(doc.paths['/v1/keys'])).toEqual(expect.arrayContaining(['get', 'post']));
    expect(Object.keys(doc.paths['/v1/keys/{id}'])).toEqual(['delete']);
  });
});
