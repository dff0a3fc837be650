/**
 * When a desktop recorded awake is found gone from its relinked host (engine/reconcile-awake.ts),
 * its meter closes when the previous agent was last heard from only on the relink right after that
 * agent's restart; on a later relink (a guest that outlived the restart, or a failover long after
 * it) the death was not seen, and the meter closes when it was found.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { insertDesktop } from '../../scheduler/src/store/desktops.js';
import { ensureOrg } from '../../scheduler/src/store/orgs.js';
import { reconcileAwake } from '../../scheduler/src/engine/reconcile-awake.js';
import { acquireLease, LEADER_LEASE } from '../../scheduler/src/store/leases.js';
import type { StepDeps } from '../../scheduler/src/engine/steps.js';
import { newId } from '../../shared/src/ids.js';
import { silentLogger } from '../../shared/src/log.js';
import { freshDatabaseUrl } from '../helpers/db.js';

let sql: Sql;
/** The term the checks run in: their writes are the leader's (store/leases.ts `assertTerm`). */
let fence: { holder: string; epoch: number };
beforeAll(async () => {
  sql = connectDatabase(await freshDatabaseUrl(), { max: 2 });
  fence = { holder: 'replica-test', epoch: (await acquireLease(sql, LEADER_LEASE, 'replica-test', 600_000)).epoch };
});
afterAll(async () => {
  await sql?.end();
});

const deps = () =>
  ({
    sql,
    logger: silentLogger(),
    leading: () => true,
    fence,
    agentCommandTimeoutMs: 1_000,
    agents: { speaks: () => true, call: async () => ({ running: false, has_snapshot: false }) },
  }) as unknown as StepDeps;

/** An awake desktop metered since `wokeAgo`, on a host whose agent restarted `restartedAgo` ago, the one before last heard `previousAgo` ago. */
async function gone(wokeAgo: string, previousAgo: string, restartedAgo: string): Promise<{ endedAgoMs: number; previousAgoMs: number }> {
  const orgId = await ensureOrg(sql, `meter-${newId('org')}`);
  const hostId = newId('host');
  await sql`
    INSERT INTO hosts (id, hostname, agent_instance_id, protocol, runtime, memory_snapshots, vcpus, memory_mb, status, last_seen_at, previous_seen_at, instance_since)
    VALUES (${hostId}, 'h', 'i', '1.15', 'sandbox', true, 2, 4096, 'ready', now(), now() - ${previousAgo}::interval, now() - ${restartedAgo}::interval)`;
  const d = await insertDesktop(sql, { orgId, tier: 'small', imageVersion: 'test', idleTimeoutSecs: 0, billingMode: 'hourly', envSealed: null, setupScriptSealed: null });
  await sql`UPDATE desktops SET state = 'awake', host_id = ${hostId} WHERE id = ${d.id}`;
  await sql`INSERT INTO meter_intervals (org_id, desktop_id, started_at) VALUES (${orgId}, ${d.id}, now() - ${wokeAgo}::interval)`;
  await reconcileAwake(deps(), hostId, d.id);
  const [row] = await sql<Array<{ state: string; ended_ago: number; previous_ago: number }>>`
    SELECT d.state, extract(epoch FROM now() - m.ended_at) * 1000 AS ended_ago, extract(epoch FROM now() - h.previous_seen_at) * 1000 AS previous_ago
    FROM desktops d JOIN meter_intervals m ON m.desktop_id = d.id JOIN hosts h ON h.id = d.host_id WHERE d.id = ${d.id}`;
  expect(row!.state).toBe('hibernated');
  return { endedAgoMs: Number(row!.ended_ago), previousAgoMs: Number(row!.previous_ago) };
}

it('closes at the previous agent\'s last sighting on the relink right after its restart', async () => {
  const { endedAgoMs, previousAgoMs } = await gone('3 hours', '1 hour', '5 seconds');
  expect(Math.abs(endedAgoMs - previousAgoMs)).toBeLessThan(1_000);
});

it('closes when found on a relink long after the restart: the guest may have died any time since', async () => {
  const { endedAgoMs } = await gone('3 hours', '2 hours', '1 hour');
  expect(endedAgoMs).toBeLessThan(10_000);
});
