/**
 * A lease statement stuck in the database (engine/leader.ts, store/leases.ts `bounded`), on a real
 * database: another session holds the lease row locked, as a replica frozen mid-transaction or a
 * vacuum would, so the leader's renewal and its release both wait on the lock. Each is bounded by
 * the TTL and cancelled on the server: the leader stops counting itself leader, and a stopping
 * replica stops, while the lock is still held, instead of waiting for it.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { Leadership } from '../../scheduler/src/engine/leader.js';
import { acquireLease, LEADER_LEASE } from '../../scheduler/src/store/leases.js';
import { silentLogger } from '../../shared/src/log.js';
import { freshDatabaseUrl } from '../helpers/db.js';
import { until } from '../helpers/wait.js';

let sql: Sql;
let locker: Sql;

beforeAll(async () => {
  const url = await freshDatabaseUrl();
  sql = connectDatabase(url, { max: 4 });
  locker = connectDatabase(url, { max: 1 });
});

afterAll(async () => {
  await sql?.end();
  await locker?.end();
});

it('gives up a renewal and a release stuck behind a lock on the lease row, within the TTL', async () => {
  const leadership = new Leadership(sql, 'replica-stuck', 1_000, 300, { establish: async () => undefined, revoke: async () => undefined }, silentLogger());
  await leadership.start();
  await until(() => leadership.isLeader(), 10_000, 'the replica to lead');
  let lockReleased = false;
  // The row locked for 8 s by a session that is busy, not idle (so no idle timeout ends it).
  const holding = locker.begin(async (tx) => {
    await tx`SELECT * FROM leases WHERE name = ${LEADER_LEASE} FOR UPDATE`;
    await tx`SELECT pg_sleep(8)`;
  }).finally(() => (lockReleased = true));
  // The renewals now wait on the lock; the local view lapses within the TTL.
  await until(() => !leadership.isLeader(), 5_000, 'the replica to stop counting itself leader');
  await leadership.stop();
  expect(lockReleased).toBe(false);
  await holding;
  // What the database answers once the lock is gone: the stuck renewal was cancelled, not
  // landed late, so another replica takes the lease within a TTL.
  await until(async () => (await acquireLease(sql, LEADER_LEASE, 'replica-next', 1_000)).held, 3_000, 'another replica to take the lease');
}, 30_000);
