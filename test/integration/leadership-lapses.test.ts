/**
 * The leader lease when renewals go wrong (engine/leader.ts), on a real database:
 * - a leader whose renewals fail stops counting itself leader once what the last answer granted
 *   runs out, and another replica takes over: failed renewals extend nothing;
 * - a lease that lapsed once, while a step's agent command is in flight (which its revoke waits
 *   for), starts one new term, not a new one every TTL: renewals do not wait for the hooks.
 */
import { afterEach, expect, it } from 'vitest';
import { api, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { connectDatabase } from '../../scheduler/src/store/db.js';

const running: Array<{ close(): Promise<void> } | TestAgent> = [];

afterEach(async () => {
  for (const r of running.splice(0).reverse()) await ('driver' in r ? r.stop() : r.close());
});

it('stops leading once its renewals fail, and another replica takes over', async () => {
  const a = await startTestScheduler({ CANTO_REPLICA_ID: 'replica-a' });
  running.push(a);
  await until(() => a.leadership.isLeader(), 10_000, 'replica a to lead');
  const b = await startTestScheduler({ CANTO_REPLICA_ID: 'replica-b' }, a.databaseUrl);
  running.push(b);
  const sql = connectDatabase(a.databaseUrl, { max: 1 });
  try {
    // Every renewal of replica a fails from now on (its connections refused, say).
    await sql.unsafe(`
      CREATE OR REPLACE FUNCTION refuse_a() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN RAISE EXCEPTION 'refused' USING ERRCODE = '08006'; END $$;
      CREATE TRIGGER refuse_a BEFORE UPDATE ON leases FOR EACH ROW WHEN (NEW.holder = 'replica-a') EXECUTE FUNCTION refuse_a();`);
    const since = performance.now();
    await until(() => b.leadership.isLeader(), 15_000, 'replica b to take over');
    expect(a.leadership.isLeader()).toBe(false);
    // Within a TTL (3 s here) and a renewal of the last good answer, not whenever the errors stop.
    expect(performance.now() - since).toBeLessThan(6_000);
  } finally {
    await sql.unsafe('DROP TRIGGER IF EXISTS refuse_a ON leases');
    await sql.end();
  }
}, 30_000);

it('starts one new term after a lapse while a command is in flight, not one every TTL', async () => {
  const s: TestScheduler = await startTestScheduler({ CANTO_LEASE_TTL_MS: '2500', CANTO_LEASE_RENEW_MS: '500' });
  running.push(s);
  const agent = await startFakeAgent(s.url, { delayMs: 0 });
  running.push(agent);
  const call = api(s.url, await mintKey(s.databaseUrl, 'lapses'));
  const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
  expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
  expect((await call('POST', `/v1/desktops/${id}/hibernate?wait=true`)).status).toBe(200);
  // A wake whose start takes long: its step is in flight, and a revoke waits for it (2 s).
  const driver = agent.driver!;
  const start = driver.start.bind(driver);
  driver.start = async (spec) => {
    await new Promise((resolve) => setTimeout(resolve, 12_000));
    return start(spec);
  };
  await call('POST', `/v1/desktops/${id}/wake`);
  const sql = connectDatabase(s.databaseUrl, { max: 1 });
  try {
    await new Promise((resolve) => setTimeout(resolve, 300));
    const [before] = await sql<Array<{ epoch: string }>>`SELECT epoch FROM leases`;
    // One lapse, as a stall of the database or of the replica would leave.
    await sql`UPDATE leases SET expires_at = now() - interval '1 millisecond'`;
    await new Promise((resolve) => setTimeout(resolve, 9_000));
    const [after] = await sql<Array<{ epoch: string }>>`SELECT epoch FROM leases`;
    expect(Number(after!.epoch) - Number(before!.epoch)).toBe(1);
    expect(s.leadership.isLeader()).toBe(true);
  } finally {
    await sql.end();
    driver.start = start;
  }
}, 40_000);

it('lets a process restarted under the same replica id take over in a new term, and the one before stop leading', async () => {
  const a = await startTestScheduler({ CANTO_REPLICA_ID: 'replica-same' });
  running.push(a);
  await until(() => a.leadership.isLeader(), 10_000, 'the first process to lead');
  const first = a.leadership.term()!.epoch;
  // The first one did not die (it was frozen, say): a second process starts with its id.
  const b = await startTestScheduler({ CANTO_REPLICA_ID: 'replica-same' }, a.databaseUrl);
  running.push(b);
  await until(() => b.leadership.isLeader(), 10_000, 'the second process to take over at once');
  expect(b.leadership.term()!.epoch).toBeGreaterThan(first);
  await until(() => !a.leadership.isLeader(), 10_000, 'the first process to stop leading');
  // And it does not take the lease back while the second one renews it.
  await new Promise((resolve) => setTimeout(resolve, 2_000));
  expect(a.leadership.isLeader()).toBe(false);
  expect(b.leadership.isLeader()).toBe(true);
}, 30_000);
