/**
 * The leader-only loops beside the engine (the drainer, host health, the idle sweeper) fence
 * their writes on the leader term they run in, on a real database: a replica that still believes
 * it leads in term 1 (it stalled after asking, and resumes before its next renewal tells it
 * otherwise) writes nothing once replica b's term 2 has begun; the same pass in term 2 writes.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { connectDatabase, inTransaction, type Sql } from '../../scheduler/src/store/db.js';
import { acquireLease, assertTerm, LEADER_LEASE } from '../../scheduler/src/store/leases.js';
import { insertDesktop } from '../../scheduler/src/store/desktops.js';
import { ensureOrg } from '../../scheduler/src/store/orgs.js';
import type { SettleFence } from '../../scheduler/src/store/operations.js';
import { Drainer } from '../../scheduler/src/engine/drainer.js';
import { HostHealth } from '../../scheduler/src/engine/host-health.js';
import { IdleSweeper } from '../../scheduler/src/engine/idle-sweeper.js';
import { LifecycleService } from '../../scheduler/src/services/lifecycle.js';
import { newId } from '../../shared/src/ids.js';
import { silentLogger } from '../../shared/src/log.js';
import { freshDatabaseUrl } from '../helpers/db.js';

let sql: Sql;
let orgId: string;
/** Replica a's term, which it still believes in. */
let stale: SettleFence;
/** Replica b's, begun after a's lapsed. */
let current: SettleFence;

beforeAll(async () => {
  sql = connectDatabase(await freshDatabaseUrl(), { max: 4 });
  orgId = await ensureOrg(sql, 'fences');
  const a = await acquireLease(sql, LEADER_LEASE, 'replica-a', 60_000);
  await sql`UPDATE leases SET expires_at = now() - interval '1 millisecond'`;
  const b = await acquireLease(sql, LEADER_LEASE, 'replica-b', 60_000);
  expect([a.held, b.held, b.epoch]).toEqual([true, true, a.epoch + 1]);
  stale = { holder: 'replica-a', epoch: a.epoch };
  current = { holder: 'replica-b', epoch: b.epoch };
});

afterAll(async () => {
  await sql?.end();
});

async function host(status: 'ready' | 'down', silentFor: string, drain: number | null = null): Promise<string> {
  const id = newId('host');
  await sql`
    INSERT INTO hosts (id, hostname, agent_instance_id, protocol, runtime, memory_snapshots, vcpus, memory_mb, status, last_seen_at,
                       cordoned, drain_requested_at, drain_parallel)
    VALUES (${id}, 'h', 'i', '1.15', 'sandbox', true, 2, 4096, ${status}, now() - ${silentFor}::interval,
            ${drain !== null}, ${drain === null ? null : sql`now()`}, ${drain})`;
  return id;
}

async function desktop(hostId: string, state: 'awake' | 'hibernated', idleTimeoutSecs = 0): Promise<string> {
  const d = await insertDesktop(sql, {
    orgId, tier: 'small', imageVersion: 'test', idleTimeoutSecs, billingMode: 'hourly', envSealed: null, setupScriptSealed: null,
  });
  await sql`UPDATE desktops SET state = ${state}, host_id = ${hostId}, last_woken_at = now() - interval '1 hour' WHERE id = ${d.id}`;
  return d.id;
}

const stateOf = async (table: 'hosts' | 'desktops', id: string) =>
  (await sql<Array<{ v: string }>>`SELECT ${sql(table === 'hosts' ? 'status' : 'state')} AS v FROM ${sql(table)} WHERE id = ${id}`)[0]?.v;

it('a drain pass of a deposed term neither moves a desktop nor ends a drain', async () => {
  const drainer = (term: SettleFence) => new Drainer({ sql, logger: silentLogger(), intervalMs: 60_000, isConnected: () => true, term: () => term });
  await host('ready', '0 seconds');
  // One drain at a time: a pass ends at its first refused write.
  const full = await host('ready', '0 seconds', 2);
  const ids = [await desktop(full, 'awake'), await desktop(full, 'hibernated')];
  const moves = async () => (await sql`SELECT 1 FROM operations WHERE kind = 'move' AND desktop_id = ANY(${ids}::text[])`).length;
  await drainer(stale).pass();
  expect(await moves()).toBe(0);
  await drainer(current).pass();
  expect(await moves()).toBe(2);

  await sql`UPDATE hosts SET drain_requested_at = NULL WHERE id = ${full}`;
  const empty = await host('ready', '0 seconds', 1);
  const ended = async () => (await sql<Array<{ at: Date | null }>>`SELECT drain_finished_at AS at FROM hosts WHERE id = ${empty}`)[0]?.at ?? null;
  await drainer(stale).pass();
  expect(await ended()).toBeNull();
  await drainer(current).pass();
  expect(await ended()).not.toBeNull();
});

it('a host health sweep of a deposed term neither marks a host down nor force-hibernates its desktops', async () => {
  const silent = await host('ready', '1 hour');
  const down = await host('down', '1 hour');
  const onSilent = await desktop(silent, 'awake');
  const onDown = await desktop(down, 'awake');
  const health = (term: SettleFence) =>
    new HostHealth({ sql, downMs: 1_000, graceMs: 1_000, intervalMs: 60_000, recordingSince: () => new Date(0), isLinked: () => false, term: () => term, logger: silentLogger() });

  await health(stale).sweep();
  expect([await stateOf('hosts', silent), await stateOf('desktops', onSilent), await stateOf('desktops', onDown)]).toEqual(['ready', 'awake', 'awake']);

  await health(current).sweep();
  expect([await stateOf('hosts', silent), await stateOf('desktops', onSilent), await stateOf('desktops', onDown)]).toEqual(['down', 'hibernated', 'hibernated']);
});

it('an idle sweep of a deposed term asks for no hibernate', async () => {
  const id = await desktop(await host('ready', '0 seconds'), 'awake', 60);
  const sweeper = (term: SettleFence) => new IdleSweeper(sql, new LifecycleService(sql), 60_000, silentLogger(), () => term);
  const hibernates = async () => (await sql`SELECT 1 FROM operations WHERE desktop_id = ${id} AND kind = 'hibernate' AND reason = 'idle_timeout'`).length;

  await sweeper(stale).sweep();
  expect([await hibernates(), await stateOf('desktops', id)]).toEqual([0, 'awake']);

  await sweeper(current).sweep();
  expect([await hibernates(), await stateOf('desktops', id)]).toEqual([1, 'hibernating']);
});

it('holds a takeover back until a write fenced on the term before it has ended', async () => {
  // The last test: it ends the current term. That term's lease now runs out in a second.
  await sql`UPDATE leases SET expires_at = now() + interval '1 second' WHERE name = ${LEADER_LEASE}`;
  const order: string[] = [];
  const writing = inTransaction(sql, async (tx) => {
    await assertTerm(tx, current);
    // A stall past the lease's end: the term lapses while the write is still to come.
    await new Promise((resolve) => setTimeout(resolve, 1_600));
    order.push('fenced write committed');
  });
  await new Promise((resolve) => setTimeout(resolve, 1_200));
  const taken = acquireLease(sql, LEADER_LEASE, 'replica-c', 60_000).then((t) => order.push(`taken over: ${t.held}`));
  await Promise.all([writing, taken]);
  expect(order).toEqual(['fenced write committed', 'taken over: true']);
});
