/**
 * The scheduler's gauges read from the database at scrape time (observability/metrics.ts) show
 * nothing, not their last reading, once the database cannot be read: they kept showing the state
 * from before the outage ("no host down", "no drain stopped") for as long as it lasted. Real
 * PostgreSQL; the outage is the client's connection ended under it.
 */
import { expect, it } from 'vitest';
import { SchedulerMetrics } from '../../scheduler/src/observability/metrics.js';
import { connectDatabase } from '../../scheduler/src/store/db.js';
import { freshDatabaseUrl } from '../helpers/db.js';

it('drops a database gauge whose query fails instead of repeating its last reading', async () => {
  const sql = connectDatabase(await freshDatabaseUrl(), { max: 1 });
  await sql`INSERT INTO hosts (id, hostname, agent_instance_id, protocol, runtime, memory_snapshots, vcpus, memory_mb, status, last_seen_at)
    VALUES ('host_metricsgauge000000000001', 'h', 'i', '1.17', 'fake', false, 2, 4096, 'down', now())`;
  const metrics = new SchedulerMetrics();
  metrics.attach({ sql, agentLinks: () => 0, isLeader: () => false, leaseEpoch: () => 0 });
  expect(await metrics.text()).toMatch(/^canto_hosts\{status="down"\} 1$/m);
  await sql.end();
  const after = await metrics.text();
  expect(after).not.toMatch(/^canto_hosts\{/m);
  expect(after).not.toMatch(/^canto_desktops\{/m);
  // One without labels cannot be absent: it reads NaN, not a count of 0.
  expect(after).toMatch(/^canto_outbox_undispatched nan$/im);
  expect(after).toMatch(/^canto_replicas_live nan$/im);
  // What does not come from the database is still there.
  expect(after).toMatch(/^canto_leader 0$/m);
});
