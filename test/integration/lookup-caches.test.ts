/**
 * The per-replica caches of API key and desktop route lookups (store/notified-cache.ts), against a
 * real Postgres: a kept value costs no query, a changed row is dropped through its trigger's
 * notification, a lookup racing a change of its row is not kept (one racing another row's is), a
 * reconnected listener starts empty; an awake desktop's route comes with the notification of
 * its change, so the first guest call after a wake reads no row; and
 * through the API a revoked key is refused at once while a stale desktop route corrects itself.
 * The org a JWT names is created once and afterwards only read.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { API_KEY_CHANGED_CHANNEL, DESKTOP_CHANGED_CHANNEL, DESKTOP_ROUTE_CHANNEL, NotifiedCache } from '../../scheduler/src/store/notified-cache.js';
import { isRoutable, routeNotification, type DesktopRoute } from '../../scheduler/src/services/guest.js';
import { PROTOCOL_VERSION } from '../../shared/src/protocol.js';
import { createApiKey, KeyService, orgForApiKey } from '../../scheduler/src/services/keys.js';
import { hashToken } from '../../scheduler/src/crypto/secret-box.js';
import { ensureOrg, orgForKeyHash } from '../../scheduler/src/store/orgs.js';
import { freshDatabaseUrl } from '../helpers/db.js';
import { api, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { expectProblem } from '../helpers/problem.js';

let sql: Sql;
const stops: Array<() => Promise<void>> = [];

beforeAll(async () => {
  sql = connectDatabase(await freshDatabaseUrl(), { max: 4 });
});

afterEach(async () => {
  for (const stop of stops.splice(0)) await stop();
});

afterAll(async () => {
  await sql?.end();
});

/** A cache on `channel` whose loads are counted. */
async function listening(channel: string, options: { ttlMs?: number; now?: () => number } = {}) {
  const cache = new NotifiedCache<string>({ ttlMs: options.ttlMs ?? 60_000, maxEntries: 100, now: options.now });
  stops.push(await cache.listen(sql, channel));
  return cache;
}

function countingLoader<T>(load: () => Promise<T | null>) {
  const counter = {
    loads: 0,
    load: async () => {
      counter.loads++;
      return load();
    },
  };
  return counter;
}

describe('NotifiedCache', () => {
  it('serves a kept value without a query and drops it when the row changes', async () => {
    const { key } = await createApiKey(sql, 'cache-a');
    const hash = hashToken(key);
    const cache = await listening(API_KEY_CHANGED_CHANNEL);
    const loader = countingLoader(() => orgForKeyHash(sql, hash));
    const org = await cache.get(hash, loader.load, () => true);
    expect(org).toMatch(/^org_/);
    expect(await cache.get(hash, loader.load, () => true)).toBe(org);
    expect(loader.loads).toBe(1);

    await sql`UPDATE api_keys SET revoked_at = now() WHERE token_hash = ${hash}`;
    await until(() => cache.size === 0, 5_000, 'the revocation notification');
    expect(await cache.get(hash, loader.load, () => true)).toBeNull();
    expect(loader.loads).toBe(2);
  });

  it('drops a key its own replica revoked before the revocation is heard', async () => {
    const { orgId, key } = await createApiKey(sql, 'cache-revoke');
    // Listening where nothing comes: only the revoke itself can drop the key here.
    const cache = await listening('canto_test_silent');
    expect(await orgForApiKey(sql, key, cache)).toBe(orgId);
    const [row] = await sql<Array<{ id: string }>>`SELECT id FROM api_keys WHERE token_hash = ${hashToken(key)}`;
    await new KeyService(sql, cache).revoke(orgId, row!.id);
    expect(await orgForApiKey(sql, key, cache)).toBeNull();
  });

  it('keeps only what `keep` accepts, and never a missing row', async () => {
    const cache = await listening(API_KEY_CHANGED_CHANNEL);
    const missing = countingLoader(async () => null);
    await cache.get('nothing', missing.load, () => true);
    await cache.get('nothing', missing.load, () => true);
    expect(missing.loads).toBe(2);
    const refused = countingLoader(async () => 'value');
    await cache.get('refused', refused.load, () => false);
    await cache.get('refused', refused.load, () => false);
    expect(refused.loads).toBe(2);
  });

  /** A lookup of `key` held until `drop` has run, and what the cache kept afterwards. */
  async function lookupAcross(cache: NotifiedCache<string>, key: string, drop: () => void): Promise<number> {
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const slow = countingLoader(async () => {
      await gate;
      return 'old';
    });
    const pending = cache.get(key, slow.load, () => true);
    drop();
    release();
    expect(await pending).toBe('old');
    return cache.size;
  }

  it('does not keep a lookup that was in flight when its row changed, or the cache was emptied', async () => {
    const cache = await listening(DESKTOP_CHANGED_CHANNEL);
    expect(await lookupAcross(cache, 'dsk_x', () => cache.evict('dsk_x'))).toBe(0);
    const fresh = countingLoader(async () => 'new');
    expect(await cache.get('dsk_x', fresh.load, () => true)).toBe('new');
    expect(fresh.loads).toBe(1);
    cache.evict('dsk_x');
    expect(await lookupAcross(cache, 'dsk_y', () => cache.clear())).toBe(0);
  });

  it("keeps a lookup that was in flight when another row changed: a busy fleet's changes do not empty it", async () => {
    const cache = await listening(DESKTOP_CHANGED_CHANNEL);
    expect(await lookupAcross(cache, 'dsk_x', () => cache.evict('dsk_other'))).toBe(1);
    const again = countingLoader(async () => 'new');
    expect(await cache.get('dsk_x', again.load, () => true)).toBe('old');
    expect(again.loads).toBe(0);
  });

  it('hears a desktop row change by its id', async () => {
    const { orgId } = await createApiKey(sql, 'cache-d');
    const [row] = await sql<{ id: string }[]>`
      INSERT INTO desktops (id, org_id, tier, state, image_version, current_generation_id, idle_timeout_secs, billing_mode)
      VALUES ('dsk_cachetest000000000000000', ${orgId}, 'small', 'awake', 'v1', 'gen_cachetest000000000000', 0, 'hourly') RETURNING id`;
    const cache = await listening(DESKTOP_CHANGED_CHANNEL);
    await cache.get(row!.id, async () => 'awake', () => true);
    await cache.get('dsk_untouched', async () => 'awake', () => true);
    expect(cache.size).toBe(2);
    await sql`UPDATE desktops SET state = 'hibernating' WHERE id = ${row!.id}`;
    await until(() => cache.size === 1, 5_000, 'the desktop notification');
    const again = countingLoader(async () => 'hibernating');
    expect(await cache.get(row!.id, again.load, () => true)).toBe('hibernating');
    expect(again.loads).toBe(1);
  });

  it('serves an entry until its time limit, then reads again', async () => {
    let now = 1_000;
    const cache = await listening(API_KEY_CHANGED_CHANNEL, { ttlMs: 500, now: () => now });
    const loader = countingLoader(async () => 'org_1');
    await cache.get('k', loader.load, () => true);
    now += 499;
    await cache.get('k', loader.load, () => true);
    expect(loader.loads).toBe(1);
    now += 1;
    await cache.get('k', loader.load, () => true);
    expect(loader.loads).toBe(2);
  });

  it('keeps nothing before listening starts, and starts empty after the listener reconnects', async () => {
    const idle = new NotifiedCache<string>({ ttlMs: 60_000, maxEntries: 10 });
    const unheard = countingLoader(async () => 'v');
    await idle.get('k', unheard.load, () => true);
    await idle.get('k', unheard.load, () => true);
    expect(unheard.loads).toBe(2);

    const cache = await listening(DESKTOP_CHANGED_CHANNEL);
    await cache.get('k', async () => 'v', () => true);
    expect(cache.size).toBe(1);
    // Changes made while the listen connection is down are never heard: the cache must forget.
    const killed = await sql`
      SELECT pg_terminate_backend(pid) FROM pg_stat_activity
      WHERE datname = current_database() AND query ILIKE 'listen%' AND pid <> pg_backend_pid()`;
    expect(killed.length).toBeGreaterThan(0);
    await until(() => cache.size === 0, 10_000, 'the cache to be emptied on reconnect');
    // And it is listening again.
    const { key } = await createApiKey(sql, 'cache-r');
    const keys = await listening(API_KEY_CHANGED_CHANNEL);
    await keys.get(hashToken(key), async () => 'org', () => true);
    await sql`DELETE FROM api_keys WHERE token_hash = ${hashToken(key)}`;
    await until(() => keys.size === 0, 5_000, 'the delete notification');
  });

  it('drops the oldest entry when full', async () => {
    const cache = new NotifiedCache<string>({ ttlMs: 60_000, maxEntries: 2 });
    stops.push(await cache.listen(sql, DESKTOP_CHANGED_CHANNEL));
    for (const k of ['a', 'b', 'c']) await cache.get(k, async () => k, () => true);
    expect(cache.size).toBe(2);
    const a = countingLoader(async () => 'a');
    await cache.get('a', a.load, () => true);
    expect(a.loads).toBe(1);
  });
});

describe('desktop routes from their change notifications', () => {
  async function routeCache() {
    const cache = new NotifiedCache<DesktopRoute>({ ttlMs: 60_000, maxEntries: 100 });
    stops.push(await cache.listenValues(sql, DESKTOP_ROUTE_CHANNEL, routeNotification, isRoutable));
    return cache;
  }

  /** A hibernated desktop on a host of its own. */
  async function hibernatedDesktop(name: string) {
    const { orgId } = await createApiKey(sql, name);
    const hostId = `host_${name}`;
    await sql`
      INSERT INTO hosts (id, hostname, agent_instance_id, protocol, runtime, memory_snapshots, vcpus, memory_mb, status)
      VALUES (${hostId}, ${name}, ${`inst_${name}`}, ${PROTOCOL_VERSION}, 'fake', false, 2, 4096, 'ready')`;
    const id = `dsk_${name.replace(/-/g, '')}`.padEnd(28, '0');
    await sql`
      INSERT INTO desktops (id, org_id, tier, state, host_id, image_version, current_generation_id, idle_timeout_secs, billing_mode)
      VALUES (${id}, ${orgId}, 'small', 'hibernated', ${hostId}, 'v1', ${`gen_${name}`}, 0, 'hourly')`;
    return { id, orgId, hostId };
  }

  const unread = () => countingLoader<DesktopRoute>(async () => null);

  it('takes an awake route from the change itself, and drops it when the desktop stops being reachable or goes', async () => {
    const d = await hibernatedDesktop('route-a');
    const cache = await routeCache();
    await sql`UPDATE desktops SET state = 'awake', generation = 7 WHERE id = ${d.id}`;
    await until(() => cache.size === 1, 5_000, 'the wake notification');
    const loader = unread();
    expect(await cache.get(d.id, loader.load, isRoutable)).toEqual({ org_id: d.orgId, state: 'awake', host_id: d.hostId, generation: 7, moving: false });
    expect(loader.loads).toBe(0);
    // A change that leaves the route as it was (a timestamp) keeps it; a move in progress drops it.
    await sql`UPDATE desktops SET last_woken_at = now() WHERE id = ${d.id}`;
    await sql`UPDATE desktops SET moving_operation_id = 'op_routetest' WHERE id = ${d.id}`;
    await until(() => cache.size === 0, 5_000, 'the move notification');
    await sql`UPDATE desktops SET moving_operation_id = NULL WHERE id = ${d.id}`;
    await until(() => cache.size === 1, 5_000, 'the rollback notification');
    await sql`DELETE FROM desktops WHERE id = ${d.id}`;
    await until(() => cache.size === 0, 5_000, 'the delete notification');
  });

  it('does not keep a lookup that was in flight when its row changed; the change itself is kept', async () => {
    const d = await hibernatedDesktop('route-b');
    const cache = await routeCache();
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const stale: DesktopRoute = { org_id: d.orgId, state: 'awake', host_id: d.hostId, generation: 1, moving: false };
    const pending = cache.get(d.id, async () => (await gate, stale), isRoutable);
    await sql`UPDATE desktops SET state = 'awake', generation = 2 WHERE id = ${d.id}`;
    await until(() => cache.size === 1, 5_000, 'the wake notification');
    release();
    expect(await pending).toBe(stale);
    expect((await cache.get(d.id, unread().load, isRoutable))?.generation).toBe(2);
  });

  it('reads a payload that is not a route as "anything may have changed"', async () => {
    const d = await hibernatedDesktop('route-c');
    const cache = await routeCache();
    await sql`UPDATE desktops SET state = 'awake' WHERE id = ${d.id}`;
    await until(() => cache.size === 1, 5_000, 'the wake notification');
    await sql`SELECT pg_notify(${DESKTOP_ROUTE_CHANNEL}, 'not json')`;
    await until(() => cache.size === 0, 5_000, 'the cache to be emptied');
    expect(routeNotification('{"id":"dsk_x","state":"awake"}')).toBeNull();
    expect(routeNotification('{"id":"dsk_x"}')).toEqual({ key: 'dsk_x', value: null });
  });
});

describe('ensureOrg', () => {
  it('creates an org once when many requests see it first, and only reads it afterwards', async () => {
    const ids = await Promise.all(Array.from({ length: 12 }, () => ensureOrg(sql, 'first-sight')));
    expect(new Set(ids).size).toBe(1);
    const version = async () => (await sql<{ v: string }[]>`SELECT xmin::text AS v FROM orgs WHERE name = 'first-sight'`)[0]!.v;
    const before = await version();
    expect(await ensureOrg(sql, 'first-sight')).toBe(ids[0]);
    // No new row version: a known org is not written (an upsert would lock and rewrite it).
    expect(await version()).toBe(before);
  });
});

describe('lookup caches behind the API', () => {
  let s: TestScheduler;
  let agent: TestAgent;

  beforeAll(async () => {
    s = await startTestScheduler();
    agent = await startFakeAgent(s.url);
  });

  afterAll(async () => {
    await agent?.stop();
    await s?.close();
  });

  it('refuses a revoked key on the next request', async () => {
    const key = await mintKey(s.databaseUrl, 'revoked-org');
    const call = api(s.url, key);
    expect((await call('GET', '/v1/desktops')).status).toBe(200);
    expect((await call('GET', '/v1/desktops')).status).toBe(200);
    const db = connectDatabase(s.databaseUrl, { max: 1 });
    try {
      await db`UPDATE api_keys SET revoked_at = now() WHERE token_hash = ${hashToken(key)}`;
    } finally {
      await db.end();
    }
    // The cache keeps a key for 30 s; only the notification can make this prompt.
    await until(async () => (await call('GET', '/v1/desktops')).status === 401, 2_000, 'the revoked key to be refused');
  });

  it('a stale desktop route reaches an agent that answers not running, and is dropped', async () => {
    const call = api(s.url, await mintKey(s.databaseUrl, 'route-org'));
    const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
    expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).json.state).toBe('succeeded');
    expect((await call('POST', `/v1/desktops/${id}/exec`, { command: 'echo one' })).json.stdout).toBe('one\n');
    // Without its trigger the cache never hears of the hibernate: only the agent's answer can correct it.
    const db = connectDatabase(s.databaseUrl, { max: 1 });
    try {
      await db`ALTER TABLE desktops DISABLE TRIGGER desktops_route_changed`;
      expect((await call('POST', `/v1/desktops/${id}/hibernate?wait=true`)).json.state).toBe('succeeded');
      expectProblem(await call('POST', `/v1/desktops/${id}/exec`, { command: 'true' }), 409, 'not running on its host');
      expectProblem(await call('POST', `/v1/desktops/${id}/exec`, { command: 'true' }), 409, 'hibernated');
      expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).json.state).toBe('succeeded');
      expect((await call('POST', `/v1/desktops/${id}/exec`, { command: 'echo two' })).json.stdout).toBe('two\n');
    } finally {
      await db`ALTER TABLE desktops ENABLE TRIGGER desktops_route_changed`;
      await db.end();
    }
  });

  it('answers another org exactly like a missing desktop, cached or not', async () => {
    const owner = api(s.url, await mintKey(s.databaseUrl, 'owner-org'));
    const other = api(s.url, await mintKey(s.databaseUrl, 'other-org'));
    const id = (await owner('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
    expect((await owner('POST', `/v1/desktops/${id}/wake?wait=true`)).json.state).toBe('succeeded');
    expect((await owner('POST', `/v1/desktops/${id}/exec`, { command: 'true' })).status).toBe(200);
    const theirs = await other('POST', `/v1/desktops/${id}/exec`, { command: 'true' });
    const missing = await other('POST', '/v1/desktops/dsk_000000000000000000000000/exec', { command: 'true' });
    expect(theirs.status).toBe(404);
    expect(theirs.json).toEqual(missing.json);
  });
});
