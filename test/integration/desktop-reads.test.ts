/**
 * Coalesced desktop reads (store/desktop-reads.ts) against a real Postgres: reads of one event-loop
 * turn share one query, each still answers only its own org's desktop (another org's reads as
 * missing), and a read sent after a commit sees it — nothing is cached between turns.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { DesktopReads } from '../../scheduler/src/store/desktop-reads.js';
import { insertDesktop } from '../../scheduler/src/store/desktops.js';
import { ensureOrg } from '../../scheduler/src/store/orgs.js';
import { freshDatabaseUrl } from '../helpers/db.js';

let sql: Sql;

beforeAll(async () => {
  sql = connectDatabase(await freshDatabaseUrl(), { max: 4 });
});

afterAll(async () => {
  await sql?.end();
});

/** `sql` whose `unsafe` queries are counted. */
function counting(): { sql: Sql; queries: () => number } {
  let n = 0;
  const proxy = new Proxy(sql, {
    get(target, prop, receiver) {
      if (prop !== 'unsafe') return Reflect.get(target, prop, receiver);
      return (...args: Parameters<Sql['unsafe']>) => {
        n++;
        return target.unsafe(...args);
      };
    },
  });
  return { sql: proxy, queries: () => n };
}

async function desktopOf(orgName: string) {
  const orgId = await ensureOrg(sql, orgName);
  const row = await insertDesktop(sql, {
    orgId, tier: 'small', imageVersion: 'test', idleTimeoutSecs: 0, billingMode: 'hourly', envSealed: Buffer.from('sealed'), setupScriptSealed: null,
  });
  return { orgId, id: row.id };
}

describe('DesktopReads', () => {
  it('answers every read of one turn with one query, each for its own org only', async () => {
    const a = await desktopOf('reads-a');
    const a2 = await desktopOf('reads-a');
    const b = await desktopOf('reads-b');
    const { sql: counted, queries } = counting();
    const reads = new DesktopReads(counted);
    const answers = await Promise.all([
      reads.get(a.orgId, a.id),
      reads.get(a.orgId, a2.id),
      reads.get(a.orgId, a.id),
      reads.get(b.orgId, b.id),
      reads.get(a.orgId, b.id), // another org's desktop
      reads.get(a.orgId, 'dsk_missing'),
    ]);
    expect(queries()).toBe(1);
    expect(answers.map((r) => r?.id ?? null)).toEqual([a.id, a2.id, a.id, b.id, null, null]);
    expect(answers[0]).toMatchObject({ org_id: a.orgId, state: 'provisioning', tier: 'small', host_id: null, host_status: null });
    // The API's columns only: sealed secrets are not read.
    expect(answers[0]).not.toHaveProperty('env_sealed');
  });

  it('sends reads of a later turn as a new query that sees what was committed meanwhile', async () => {
    const a = await desktopOf('reads-c');
    const { sql: counted, queries } = counting();
    const reads = new DesktopReads(counted);
    expect((await reads.get(a.orgId, a.id))?.idle_timeout_secs).toBe(0);
    await sql`UPDATE desktops SET idle_timeout_secs = 600 WHERE id = ${a.id}`;
    expect((await reads.get(a.orgId, a.id))?.idle_timeout_secs).toBe(600);
    expect(queries()).toBe(2);
  });

  it('fails every read of a batch whose query fails', async () => {
    const a = await desktopOf('reads-d');
    const broken = new Proxy(sql, {
      get: (target, prop, receiver) => (prop === 'unsafe' ? () => Promise.reject(new Error('database gone')) : Reflect.get(target, prop, receiver)),
    });
    const reads = new DesktopReads(broken);
    const outcomes = await Promise.allSettled([reads.get(a.orgId, a.id), reads.get(a.orgId, 'dsk_x')]);
    expect(outcomes.map((o) => o.status)).toEqual(['rejected', 'rejected']);
  });
});
