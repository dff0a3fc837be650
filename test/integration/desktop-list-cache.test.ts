/**
 * The serialized desktop list (services/desktop-list.ts) against a real Postgres: a list nothing
 * in the database changed is answered from memory, and every change another replica could make
 * (a desktop's state, a new or removed desktop, its host going down) shows on the very next list.
 * Another org's list and another state filter never share an answer.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { insertDesktop, listDesktopViewsFingerprinted } from '../../scheduler/src/store/desktops.js';
import { ensureOrg } from '../../scheduler/src/store/orgs.js';
import { DesktopList } from '../../scheduler/src/services/desktop-list.js';
import { toDesktopJson } from '../../scheduler/src/services/json.js';
import type { DesktopJson } from '../../scheduler/src/api/schemas.js';
import type { DesktopState } from '../../scheduler/src/store/rows.js';
import { newId } from '../../shared/src/ids.js';
import { freshDatabaseUrl } from '../helpers/db.js';

let sql: Sql;

beforeAll(async () => {
  sql = connectDatabase(await freshDatabaseUrl(), { max: 4 });
});

afterAll(async () => {
  await sql?.end();
});

/** What the list must say: the rows read fresh, rendered as the route renders them. */
async function fresh(orgId: string, state: DesktopState | null = null): Promise<string> {
  return render((await listDesktopViewsFingerprinted(sql, orgId, state)).views.map(toDesktopJson));
}

const render = (desktops: DesktopJson[]) => JSON.stringify({ desktops });

async function orgWith(name: string, n: number): Promise<{ orgId: string; ids: string[] }> {
  const orgId = await ensureOrg(sql, `${name}-${newId('org')}`);
  const ids: string[] = [];
  for (let i = 0; i < n; i++) {
    const row = await insertDesktop(sql, {
      orgId, tier: 'small', imageVersion: 'test', idleTimeoutSecs: 0, billingMode: 'hourly', envSealed: null, setupScriptSealed: null,
    });
    ids.push(row.id);
  }
  return { orgId, ids };
}

async function addHost(): Promise<string> {
  const id = newId('host');
  await sql`
    INSERT INTO hosts (id, hostname, agent_instance_id, protocol, runtime, memory_snapshots, vcpus, memory_mb, status, last_seen_at)
    VALUES (${id}, 'h', 'i', '1.13', 'sandbox', true, 2, 4096, 'ready', now())`;
  return id;
}

/**
 * `sql` that, once armed, runs `hook` (with the real `sql`) right after the next fingerprint
 * query (the one without the rows) has answered, before the caller sees its answer: a commit
 * landing between the list's own statements.
 */
function committingAfterFingerprint(hook: () => Promise<void>): { sql: Sql; arm: () => void } {
  return committingAfter((text) => text.includes('count(*)'), hook);
}

/** The same, after the listing of ids and row versions a changed list is made again from. */
function committingAfterListing(hook: () => Promise<void>): { sql: Sql; arm: () => void } {
  return committingAfter((text) => text.includes('SELECT d.id, ('), hook);
}

function committingAfter(isTheQuery: (text: string) => boolean, hook: () => Promise<void>): { sql: Sql; arm: () => void } {
  let armed = false;
  const proxy = new Proxy(sql, {
    apply(target, thisArg, args: unknown[]) {
      const query = Reflect.apply(target, thisArg, args) as PromiseLike<unknown>;
      const text = Array.isArray(args[0]) ? args[0].join('') : '';
      if (!armed || !isTheQuery(text)) return query;
      armed = false;
      return { then: (ok: (v: unknown) => unknown, fail: (e: unknown) => unknown) => query.then(async (rows) => {
        await hook();
        return rows;
      }).then(ok, fail) };
    },
  });
  return { sql: proxy, arm: () => (armed = true) };
}

describe('DesktopList', () => {
  it('answers an unchanged list from memory, and the same bytes as a fresh read', async () => {
    const { orgId } = await orgWith('list-same', 5);
    const list = new DesktopList(sql);
    const first = await list.body(orgId, null, render);
    expect(first.toString()).toBe(await fresh(orgId));
    const second = await list.body(orgId, null, render);
    expect(second).toBe(first);
  });

  it('shows at once what another replica changed: a state, a new desktop, a removed one, a host going down', async () => {
    const { orgId, ids } = await orgWith('list-changes', 3);
    const list = new DesktopList(sql);
    const host = await addHost();
    await list.body(orgId, null, render);

    await sql`UPDATE desktops SET state = 'awake', host_id = ${host}, generation = generation + 1 WHERE id = ${ids[0]!}`;
    expect((await list.body(orgId, null, render)).toString()).toBe(await fresh(orgId));
    expect((await list.body(orgId, null, render)).toString()).toContain('"host_status":"ready"');

    await sql`UPDATE hosts SET status = 'down' WHERE id = ${host}`;
    const afterDown = (await list.body(orgId, null, render)).toString();
    expect(afterDown).toBe(await fresh(orgId));
    expect(afterDown).toContain('"host_status":"down"');

    // A heartbeat changes the host's row but nothing the list shows: still answered from memory.
    const cached = await list.body(orgId, null, render);
    await sql`UPDATE hosts SET last_seen_at = now() WHERE id = ${host}`;
    expect(await list.body(orgId, null, render)).toBe(cached);

    const added = await insertDesktop(sql, {
      orgId, tier: 'small', imageVersion: 'test', idleTimeoutSecs: 0, billingMode: 'hourly', envSealed: null, setupScriptSealed: null,
    });
    expect((await list.body(orgId, null, render)).toString()).toContain(added.id);

    await sql`DELETE FROM desktops WHERE id = ${ids[1]!}`;
    const afterDelete = (await list.body(orgId, null, render)).toString();
    expect(afterDelete).not.toContain(ids[1]!);
    expect(afterDelete).toBe(await fresh(orgId));

    // Two changes in one transaction, one of them undone: the row is a new version all the same.
    await sql.begin(async (tx) => {
      await tx`UPDATE desktops SET idle_timeout_secs = 60 WHERE id = ${ids[2]!}`;
      await tx`UPDATE desktops SET idle_timeout_secs = 0, tier = 'default' WHERE id = ${ids[2]!}`;
    });
    expect((await list.body(orgId, null, render)).toString()).toBe(await fresh(orgId));
  });

  it('never keeps rows with a fingerprint older than they are', async () => {
    const { orgId, ids } = await orgWith('list-race', 2);
    let added = '';
    // A kept list goes stale; the next read's fingerprint says so, and a desktop is created
    // between that fingerprint and the rows, then destroyed: the list is back to what that
    // fingerprint described, and must not answer with the created one.
    const racing = committingAfterFingerprint(async () => {
      added = (await insertDesktop(sql, {
        orgId, tier: 'small', imageVersion: 'test', idleTimeoutSecs: 0, billingMode: 'hourly', envSealed: null, setupScriptSealed: null,
      })).id;
    });
    const list = new DesktopList(racing.sql);
    await list.body(orgId, null, render);
    await sql`UPDATE desktops SET idle_timeout_secs = 5 WHERE id = ${ids[0]!}`;
    racing.arm();
    expect((await list.body(orgId, null, render)).toString()).toContain(added);
    await sql`DELETE FROM desktops WHERE id = ${added}`;
    const after = (await list.body(orgId, null, render)).toString();
    expect(after).not.toContain(added);
    expect(after).toBe(await fresh(orgId));
  });

  it('makes a changed list again from the rows that changed, the same bytes as a fresh read', async () => {
    const { orgId, ids } = await orgWith('list-patch', 6);
    const host = await addHost();
    await sql`UPDATE desktops SET state = 'awake', host_id = ${host} WHERE id IN (${ids[0]!}, ${ids[2]!})`;
    const list = new DesktopList(sql);
    await list.body(orgId, null, render);
    await list.body(orgId, 'awake', render);
    expect(list.answers).toEqual({ kept: 0, patched: 0, full: 2 });

    await sql`UPDATE desktops SET state = 'awake', host_id = ${host} WHERE id = ${ids[1]!}`;
    expect((await list.body(orgId, null, render)).toString()).toBe(await fresh(orgId));
    // The filtered list gains the desktop: a row it never rendered, read alone.
    expect((await list.body(orgId, 'awake', render)).toString()).toBe(await fresh(orgId, 'awake'));
    const added = await insertDesktop(sql, {
      orgId, tier: 'small', imageVersion: 'test', idleTimeoutSecs: 0, billingMode: 'hourly', envSealed: null, setupScriptSealed: null,
    });
    expect((await list.body(orgId, null, render)).toString()).toBe(await fresh(orgId));
    await sql`DELETE FROM desktops WHERE id = ${ids[4]!}`;
    expect((await list.body(orgId, null, render)).toString()).toBe(await fresh(orgId));
    // Its host going down changes the row as the list shows it, not the desktop's own row.
    await sql`UPDATE hosts SET status = 'down' WHERE id = ${host}`;
    const afterDown = (await list.body(orgId, null, render)).toString();
    expect(afterDown).toBe(await fresh(orgId));
    expect(afterDown).toContain('"host_status":"down"');
    expect(list.answers).toEqual({ kept: 0, patched: 5, full: 2 });
    // And what was made so is kept like a full read.
    expect((await list.body(orgId, null, render)).toString()).toContain(added.id);
    expect(list.answers.kept).toBe(1);
  });

  it('asks a list that changed last time for its listing at once, and one that did not for its fingerprint', async () => {
    const { orgId, ids } = await orgWith('list-churn', 4);
    let fingerprints = 0;
    const counting = new Proxy(sql, {
      apply(target, thisArg, args: unknown[]) {
        if (Array.isArray(args[0]) && args[0].join('').includes('count(*)')) fingerprints++;
        return Reflect.apply(target, thisArg, args) as unknown;
      },
    });
    const list = new DesktopList(counting);
    await list.body(orgId, null, render);
    await list.body(orgId, null, render);
    expect([fingerprints, list.answers]).toEqual([1, { kept: 1, patched: 0, full: 1 }]);
    await sql`UPDATE desktops SET idle_timeout_secs = 1 WHERE id = ${ids[0]!}`;
    await list.body(orgId, null, render);
    expect([fingerprints, list.answers]).toEqual([2, { kept: 1, patched: 1, full: 1 }]);
    // Changed again: no fingerprint first.
    await sql`UPDATE desktops SET idle_timeout_secs = 2 WHERE id = ${ids[1]!}`;
    expect((await list.body(orgId, null, render)).toString()).toBe(await fresh(orgId));
    expect([fingerprints, list.answers]).toEqual([2, { kept: 1, patched: 2, full: 1 }]);
    // Unchanged: the listing says so, and the next call asks for the fingerprint again.
    const kept = await list.body(orgId, null, render);
    expect([fingerprints, list.answers]).toEqual([2, { kept: 2, patched: 2, full: 1 }]);
    expect(await list.body(orgId, null, render)).toBe(kept);
    expect([fingerprints, list.answers]).toEqual([3, { kept: 3, patched: 2, full: 1 }]);
  });

  it('reads a list whole again when most of it changed', async () => {
    const { orgId } = await orgWith('list-most', 4);
    const list = new DesktopList(sql);
    await list.body(orgId, null, render);
    await sql`UPDATE desktops SET idle_timeout_secs = 30 WHERE org_id = ${orgId}`;
    expect((await list.body(orgId, null, render)).toString()).toBe(await fresh(orgId));
    expect(list.answers).toEqual({ kept: 0, patched: 0, full: 2 });
  });

  it('never makes a list from a row newer than its listing named', async () => {
    const { orgId, ids } = await orgWith('list-patch-race', 4);
    // Between the listing (which names row versions) and the read of the changed rows, one of
    // them changes again and another is deleted: the call reads the list whole instead.
    const racing = committingAfterListing(async () => {
      await sql`UPDATE desktops SET idle_timeout_secs = 7 WHERE id = ${ids[0]!}`;
      await sql`DELETE FROM desktops WHERE id = ${ids[3]!}`;
    });
    const list = new DesktopList(racing.sql);
    await list.body(orgId, null, render);
    await sql`UPDATE desktops SET idle_timeout_secs = 5 WHERE id = ${ids[0]!}`;
    racing.arm();
    const body = (await list.body(orgId, null, render)).toString();
    expect(body).toBe(await fresh(orgId));
    expect(body).toContain('"idle_timeout_secs":7');
    expect(list.answers).toEqual({ kept: 0, patched: 0, full: 2 });
    // And what it kept describes the database as it is: the next call answers from memory.
    expect((await list.body(orgId, null, render)).toString()).toBe(body);
    expect(list.answers.kept).toBe(1);
  });

  it('keeps orgs and state filters apart', async () => {
    const a = await orgWith('list-a', 2);
    const b = await orgWith('list-b', 2);
    await sql`UPDATE desktops SET state = 'hibernated' WHERE id = ${a.ids[0]!}`;
    const list = new DesktopList(sql);
    const all = (await list.body(a.orgId, null, render)).toString();
    const hibernated = (await list.body(a.orgId, 'hibernated', render)).toString();
    const other = (await list.body(b.orgId, null, render)).toString();
    expect(all).toBe(await fresh(a.orgId));
    expect(hibernated).toBe(await fresh(a.orgId, 'hibernated'));
    expect(JSON.parse(hibernated).desktops).toHaveLength(1);
    expect(other).toBe(await fresh(b.orgId));
    for (const id of a.ids) expect(other).not.toContain(id);
  });

  it('counts a list read by concurrent calls once', async () => {
    const { orgId } = await orgWith('list-concurrent', 3);
    // Every connection of the pool open, so that the calls' queries run side by side.
    await Promise.all([1, 2, 3, 4].map(() => sql`SELECT pg_sleep(0.05)`));
    for (let round = 0; round < 5; round++) {
      const list = new DesktopList(sql);
      const bodies = await Promise.all(Array.from({ length: 8 }, () => list.body(orgId, null, render)));
      // The body and its rows' renderings, counted once for all eight calls.
      expect(list.bytes).toBe(2 * bodies[0]!.length);
    }
  });

  it('keeps at most its byte budget, dropping the least recently used list', async () => {
    const a = await orgWith('list-budget-a', 3);
    const b = await orgWith('list-budget-b', 3);
    const size = Buffer.byteLength(await fresh(a.orgId));
    // Room for one list (a list counts twice its body: the body and its rows' renderings).
    const list = new DesktopList(sql, Math.floor(size * 3));
    const firstA = await list.body(a.orgId, null, render);
    expect(await list.body(a.orgId, null, render)).toBe(firstA);
    await list.body(b.orgId, null, render);
    expect(list.bytes).toBeLessThanOrEqual(Math.floor(size * 3));
    const againA = await list.body(a.orgId, null, render);
    expect(againA).not.toBe(firstA);
    expect(againA.equals(firstA)).toBe(true);
  });
});
