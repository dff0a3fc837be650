/**
 * Events become deliveries in their order (store/webhook-deliveries.ts `fanOutEvents`), also when
 * two fan-outs overlap, as an old leader's stalled one and the new leader's do at a failover: the
 * second waits for the first rather than pass it. It skipped the events the first had locked, so
 * a desktop's later event got the earlier delivery `seq` and reached the endpoint first (a
 * `desktop.hibernated` before the `desktop.woken` it followed). Real PostgreSQL; the stalled
 * fan-out is this test's own transaction holding the first event's row.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { connectDatabase, inTransaction, type Sql } from '../../scheduler/src/store/db.js';
import { insertDesktop } from '../../scheduler/src/store/desktops.js';
import { recordEvent } from '../../scheduler/src/store/events.js';
import { ensureOrg } from '../../scheduler/src/store/orgs.js';
import { fanOutEvents } from '../../scheduler/src/store/webhook-deliveries.js';
import { insertEndpoint } from '../../scheduler/src/store/webhooks.js';
import { newId } from '../../shared/src/ids.js';
import { freshDatabaseUrl } from '../helpers/db.js';

let sql: Sql;
let stalled: Sql;
beforeAll(async () => {
  const url = await freshDatabaseUrl();
  sql = connectDatabase(url, { max: 2 });
  stalled = connectDatabase(url, { max: 1 });
});
afterAll(async () => {
  await stalled?.end();
  await sql?.end();
});

it("fans one desktop's events out in their order when two fan-outs overlap", async () => {
  const orgId = await ensureOrg(sql, `fan-out-${newId('org')}`);
  const d = await insertDesktop(sql, { orgId, tier: 'small', imageVersion: 'test', idleTimeoutSecs: 0, billingMode: 'hourly', envSealed: null, setupScriptSealed: null });
  const endpoint = await insertEndpoint(sql, { orgId, url: 'https://receiver.example/hook', events: ['desktop.woken', 'desktop.hibernated'], sealSecret: () => Buffer.from('sealed') }, 10);
  await recordEvent(sql, { orgId, desktopId: d.id, type: 'desktop.woken' });
  await recordEvent(sql, { orgId, desktopId: d.id, type: 'desktop.hibernated', data: { reason: 'requested' } });
  const [woken, hibernated] = await sql<Array<{ id: string }>>`SELECT id FROM outbox WHERE desktop_id = ${d.id} ORDER BY id`;
  const render = (e: { type: string }) => JSON.stringify({ type: e.type });

  let second: Promise<number> | null = null;
  let passedIt = false;
  await inTransaction(stalled, async (tx) => {
    // The old leader's fan-out has taken the first event and not committed yet.
    await tx`SELECT id FROM outbox WHERE id = ${woken!.id} FOR UPDATE`;
    // The new leader's fan-out starts meanwhile.
    second = fanOutEvents(sql, 100, render);
    await new Promise((resolve) => setTimeout(resolve, 500));
    passedIt = (await sql`SELECT 1 FROM webhook_deliveries WHERE outbox_id = ${hibernated!.id}`).length > 0;
    // The old one goes on as a fan-out does: the first event's delivery, then the event marked.
    await tx`INSERT INTO webhook_deliveries (id, endpoint_id, outbox_id, desktop_id, event_type, body)
      VALUES (${newId('delivery')}, ${endpoint!.id}, ${woken!.id}, ${d.id}, 'desktop.woken', '{}')`;
    await tx`UPDATE outbox SET dispatched_at = now() WHERE id = ${woken!.id}`;
  });
  await second;
  expect(passedIt).toBe(false);
  const deliveries = await sql<Array<{ event_type: string }>>`SELECT event_type FROM webhook_deliveries WHERE desktop_id = ${d.id} ORDER BY seq`;
  expect(deliveries.map((x) => x.event_type)).toEqual(['desktop.woken', 'desktop.hibernated']);
});
