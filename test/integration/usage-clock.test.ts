/**
 * Usage reads the database's clock (services/usage.ts): the meter's times are the database's
 * `now()`, so an interval still open ends at that clock's now, whatever the replica's own clock
 * says. A replica whose clock runs an hour ahead bills an hour nobody ran without it. Events are
 * stamped by the same clock (store/events.ts): one desktop's `occurredAt` never runs backwards
 * when a leader whose clock is ahead hands over to one whose clock is right.
 */
import { afterAll, afterEach, beforeAll, expect, it, vi } from 'vitest';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { insertDesktop } from '../../scheduler/src/store/desktops.js';
import { recordEvent } from '../../scheduler/src/store/events.js';
import { ensureOrg } from '../../scheduler/src/store/orgs.js';
import { UsageService } from '../../scheduler/src/services/usage.js';
import { newId } from '../../shared/src/ids.js';
import { freshDatabaseUrl } from '../helpers/db.js';

let sql: Sql;
beforeAll(async () => {
  sql = connectDatabase(await freshDatabaseUrl(), { max: 1 });
});
afterEach(() => {
  vi.useRealTimers();
});
afterAll(async () => {
  await sql?.end();
});

it("ends an open interval at the database's now, not the replica's clock", async () => {
  const orgId = await ensureOrg(sql, `usage-${newId('org')}`);
  const d = await insertDesktop(sql, { orgId, tier: 'small', imageVersion: 'test', idleTimeoutSecs: 0, billingMode: 'hourly', envSealed: null, setupScriptSealed: null });
  await sql`INSERT INTO meter_intervals (org_id, desktop_id, started_at) VALUES (${orgId}, ${d.id}, now() - interval '10 minutes')`;
  // This replica's clock runs an hour ahead of the database's.
  vi.useFakeTimers({ toFake: ['Date'] });
  vi.setSystemTime(Date.now() + 3_600_000);
  const report = await new UsageService(sql).report(orgId, {});
  const line = report.per_desktop.find((x) => x.desktop_id === d.id)!;
  expect(line.awake_seconds).toBeGreaterThanOrEqual(600);
  expect(line.awake_seconds).toBeLessThan(660);
});

it("stamps events with the database's clock, in the order they happened whatever the replicas' clocks", async () => {
  const orgId = await ensureOrg(sql, `events-${newId('org')}`);
  const d = await insertDesktop(sql, { orgId, tier: 'small', imageVersion: 'test', idleTimeoutSecs: 0, billingMode: 'hourly', envSealed: null, setupScriptSealed: null });
  // A leader whose clock runs an hour ahead records the wake; one whose clock is right, the hibernate.
  vi.useFakeTimers({ toFake: ['Date'] });
  vi.setSystemTime(Date.now() + 3_600_000);
  await recordEvent(sql, { orgId, desktopId: d.id, type: 'desktop.woken' });
  vi.useRealTimers();
  await recordEvent(sql, { orgId, desktopId: d.id, type: 'desktop.hibernated', data: { reason: 'requested' } });
  const rows = await sql<Array<{ type: string; at: string; lag: number }>>`
    SELECT type, payload->>'occurredAt' AS at, extract(epoch FROM now() - (payload->>'occurredAt')::timestamptz) AS lag
    FROM outbox WHERE desktop_id = ${d.id} ORDER BY id`;
  expect(rows.map((r) => r.type)).toEqual(['desktop.woken', 'desktop.hibernated']);
  for (const r of rows) {
    expect(r.at).toMatch(/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/);
    expect(Math.abs(Number(r.lag))).toBeLessThan(60);
  }
  expect(Date.parse(rows[1]!.at)).toBeGreaterThanOrEqual(Date.parse(rows[0]!.at));
});
