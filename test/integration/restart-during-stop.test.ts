/**
 * A hibernate or a destroy that is open while its host restarts (a reboot that takes the guest
 * with it) and that the host comes back in time to answer: the desktop stopped running when the
 * old agent went, not when the operation finished. Its meter closes when the old agent was last
 * heard from, and a hibernate's `desktop.hibernated` says the guest was gone (`reason:
 * host_failure`, `cause: guest_gone`) rather than that the user's hibernate stopped it. A
 * restart that left the guest running changes nothing: it is billed until it stops.
 * Real scheduler and database, fake agents over real websockets.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { api, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';

/** How long the host stays away: the outage that must not be billed. */
const OUTAGE_MS = 2_500;

let s: TestScheduler;
let sql: Sql;
let call: ReturnType<typeof api>;
const agents: TestAgent[] = [];

beforeAll(async () => {
  s = await startTestScheduler({ CANTO_HEARTBEAT_MS: '200', CANTO_HOST_WAIT_MS: '20000', CANTO_HOST_FAILURE_GRACE_MS: '60000' });
  sql = connectDatabase(s.databaseUrl, { max: 2 });
  call = api(s.url, await mintKey(s.databaseUrl, 'restart-during-stop'));
});

afterAll(async () => {
  for (const agent of agents) await agent.stop().catch(() => undefined);
  await sql?.end();
  await s?.close();
});

async function meter(id: string): Promise<{ started_at: Date; ended_at: Date | null }> {
  const rows = await sql<Array<{ started_at: Date; ended_at: Date | null }>>`
    SELECT started_at, ended_at FROM meter_intervals WHERE desktop_id = ${id} ORDER BY started_at DESC LIMIT 1`;
  return rows[0]!;
}

/**
 * An awake desktop on a host of its own whose agent goes away as `op` is sent (the command is
 * never answered), stays away OUTAGE_MS, and comes back, the guest gone with it unless
 * `guestSurvives`. Answers the desktop, when the old agent was last heard from, and the operation.
 */
async function stopAcrossRestart(op: 'hibernate' | 'destroy', guestSurvives: boolean) {
  const host = await startFakeAgent(s.url, { delayMs: 0 });
  agents.push(host);
  await sql`UPDATE hosts SET cordoned = true WHERE id <> ${host.hostId}`;
  const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
  expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
  await sql`UPDATE hosts SET cordoned = false`;
  const driver = host.driver!;
  const original = driver[op].bind(driver);
  driver[op] = async () => {
    void host.stop(true);
    return new Promise(() => undefined);
  };
  const requested = await call('POST', `/v1/desktops/${id}/${op}`);
  expect(requested.status, requested.text).toBe(202);
  await until(async () => !host.connected(), 5_000, 'the agent to go');
  await new Promise((resolve) => setTimeout(resolve, OUTAGE_MS));
  const [seen] = await sql<Array<{ last_seen_at: Date }>>`SELECT last_seen_at FROM hosts WHERE id = ${host.hostId}`;
  driver[op] = original as never;
  if (!guestSurvives) driver.desktops.get(id)!.running = false;
  const back = await startFakeAgent(s.url, { again: { stateDir: host.stateDir, driver } });
  agents[agents.indexOf(host)] = back;
  const settled = await until(async () => {
    const o = (await call('GET', `/v1/operations/${requested.json.id}`)).json;
    return o.state === 'succeeded' || o.state === 'failed' ? o : null;
  }, 30_000, 'the operation to settle');
  return { id, lastSeen: seen!.last_seen_at, op: settled };
}

it('bills a hibernate whose guest died in a restart of its host until the old agent was last heard, and says so', async () => {
  const { id, lastSeen, op } = await stopAcrossRestart('hibernate', false);
  expect(op.state, JSON.stringify(op.error)).toBe('succeeded');
  expect((await call('GET', `/v1/desktops/${id}`)).json.state).toBe('hibernated');
  const m = await meter(id);
  expect(m.ended_at!.getTime()).toBe(Math.max(m.started_at.getTime(), lastSeen.getTime()));
  const events = await sql<Array<{ data: Record<string, unknown> }>>`
    SELECT payload->'data' AS data FROM outbox WHERE desktop_id = ${id} AND type = 'desktop.hibernated'`;
  expect(events.map((e) => e.data)).toEqual([expect.objectContaining({ reason: 'host_failure', cause: 'guest_gone', memory_snapshot: false })]);
}, 60_000);

it('bills a destroy whose guest died in a restart of its host until the old agent was last heard', async () => {
  const { id, lastSeen, op } = await stopAcrossRestart('destroy', false);
  expect(op.state, JSON.stringify(op.error)).toBe('succeeded');
  expect((await call('GET', `/v1/desktops/${id}`)).json.state).toBe('destroyed');
  const m = await meter(id);
  expect(m.ended_at!.getTime()).toBe(Math.max(m.started_at.getTime(), lastSeen.getTime()));
}, 60_000);

it('bills a guest that outlived the restart until the hibernate stopped it', async () => {
  const { id, lastSeen, op } = await stopAcrossRestart('hibernate', true);
  expect(op.state, JSON.stringify(op.error)).toBe('succeeded');
  const m = await meter(id);
  expect(m.ended_at!.getTime()).toBeGreaterThan(lastSeen.getTime() + OUTAGE_MS / 2);
  const events = await sql<Array<{ data: Record<string, unknown> }>>`
    SELECT payload->'data' AS data FROM outbox WHERE desktop_id = ${id} AND type = 'desktop.hibernated'`;
  expect(events.map((e) => e.data)).toEqual([expect.objectContaining({ reason: 'requested' })]);
}, 60_000);
