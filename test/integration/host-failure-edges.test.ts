/**
 * Host failure where it is not what it looks like, with a real scheduler and a real agent link
 * (FakeDriver runtime):
 * - heartbeats that could not be recorded (the database out of reach for a while) while the
 *   leader's link to the host stays alive do not fail the host: its desktops keep running, awake
 *   and billed, instead of being recorded hibernated and run on unbilled with nothing to stop them;
 * - a replica whose registry row aged out (it could not reach the database) counts as recording
 *   heartbeats only from its next refresh;
 * - a host that comes back under its identity without the disks of its desktops (a state
 *   directory wiped or replaced) has their wakes fail with `disk_missing`, instead of handing a
 *   blank desktop to a user as theirs.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, expect, it } from 'vitest';
import type { AgentHandle } from '../../agent/src/channel.js';
import { FakeDriver } from '../../agent/src/runtime/fake.js';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { upsertReplica } from '../../scheduler/src/store/replicas.js';
import { startAgentOver } from '../helpers/agent.js';
import { api, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';

const GRACE_MS = 800;

let s: TestScheduler;
let sql: Sql;
let stateDir: string;
let agent: AgentHandle | null = null;
let call: ReturnType<typeof api>;

beforeAll(async () => {
  // Heartbeats every 2 s: what a test writes into the hosts row stands for a while.
  s = await startTestScheduler({ CANTO_HOST_FAILURE_GRACE_MS: String(GRACE_MS), CANTO_HEARTBEAT_MS: '2000', CANTO_HOST_DOWN_MS: '4500' });
  sql = connectDatabase(s.databaseUrl, { max: 1 });
  stateDir = mkdtempSync(join(tmpdir(), 'canto-host-edges-'));
  call = api(s.url, await mintKey(s.databaseUrl, 'host-edges'));
});

afterEach(async () => {
  await agent?.stop();
  agent = null;
});

afterAll(async () => {
  await sql?.end();
  await s?.close();
  rmSync(stateDir, { recursive: true, force: true });
});

const connectAgent = (driver: FakeDriver): Promise<AgentHandle> => startAgentOver(s.url, stateDir, driver);

async function awakeDesktop(): Promise<string> {
  const id: string = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id;
  expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
  return id;
}

it('does not fail a host whose link is alive although its heartbeats went unrecorded', async () => {
  const driver = new FakeDriver();
  agent = await connectAgent(driver);
  const id = await awakeDesktop();
  // What an hour without the database leaves in the row, with the link to the host alive throughout.
  await sql`UPDATE hosts SET last_seen_at = now() - interval '1 hour' WHERE id = ${agent.hostId}`;
  await new Promise((resolve) => setTimeout(resolve, GRACE_MS + 700));
  expect((await call('GET', `/v1/desktops/${id}`)).json.state).toBe('awake');
  expect(driver.desktops.get(id)?.running).toBe(true);
  const [host] = await sql<Array<{ status: string }>>`SELECT status FROM hosts WHERE id = ${agent.hostId}`;
  expect(host!.status).toBe('ready');
  const failures = await sql`SELECT 1 FROM outbox WHERE desktop_id = ${id} AND payload->'data'->>'reason' = 'host_failure'`;
  expect(failures).toHaveLength(0);
}, 30_000);

it('counts a replica whose row aged out as recording only from its next refresh', async () => {
  const record = { id: 'replica-aged', url: 'http://127.0.0.1:1', version: 'test', settings: {} };
  await upsertReplica(sql, record, true, 5_000, []);
  await sql`UPDATE replicas SET started_at = now() - interval '1 hour', last_seen_at = now() - interval '1 second' WHERE id = ${record.id}`;
  await upsertReplica(sql, record, false, 5_000, []);
  const [fresh] = await sql<Array<{ age: number }>>`SELECT extract(epoch FROM now() - started_at)::float AS age FROM replicas WHERE id = ${record.id}`;
  expect(fresh!.age).toBeGreaterThan(3_000);
  // Not refreshed for longer than a row stays live: a gap in what it recorded.
  await sql`UPDATE replicas SET last_seen_at = now() - interval '1 minute' WHERE id = ${record.id}`;
  await upsertReplica(sql, record, false, 5_000, []);
  const [restarted] = await sql<Array<{ age: number }>>`SELECT extract(epoch FROM now() - started_at)::float AS age FROM replicas WHERE id = ${record.id}`;
  expect(restarted!.age).toBeLessThan(5);
  await sql`DELETE FROM replicas WHERE id = ${record.id}`;
}, 30_000);

it('fails the wake of a desktop whose disk its host no longer holds, saying so', async () => {
  agent = await connectAgent(new FakeDriver());
  const id = await awakeDesktop();
  expect((await call('POST', `/v1/desktops/${id}/hibernate?wait=true`)).status).toBe(200);
  await agent.stop();
  // The same host identity (its state directory's id and key), none of its desktops' disks.
  agent = await connectAgent(new FakeDriver());
  await until(async () => (await sql`SELECT 1 FROM hosts WHERE id = ${agent!.hostId} AND status = 'ready'`).length === 1, 10_000, 'the host to be ready');
  const woke = await call('POST', `/v1/desktops/${id}/wake?wait=true`);
  expect(woke.status, woke.text).toBe(409);
  const op = (await call('GET', `/v1/operations/${woke.json.operation_id}`)).json;
  expect(op).toMatchObject({ state: 'failed', error: { code: 'disk_missing' } });
  expect((await call('GET', `/v1/desktops/${id}`)).json.state).toBe('hibernated');
}, 30_000);

it('keeps the link of a host whose hello fence takes longer than the scheduler waits for a silent link', async () => {
  const fast = await startTestScheduler({ CANTO_HOST_FAILURE_GRACE_MS: '800', CANTO_HEARTBEAT_MS: '50', CANTO_HOST_DOWN_MS: '300' });
  const dir = mkdtempSync(join(tmpdir(), 'canto-host-fence-'));
  const connect = (driver: FakeDriver) => startAgentOver(fast.url, dir, driver);
  const db = connectDatabase(fast.databaseUrl, { max: 1 });
  let handle: AgentHandle | null = null;
  try {
    const driver = new FakeDriver();
    handle = await connect(driver);
    const fastCall = api(fast.url, await mintKey(fast.databaseUrl, 'fence'));
    const id = (await fastCall('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
    expect((await fastCall('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
    // The agent goes away past the grace: the desktop is recorded hibernated and still runs here.
    await handle.stop();
    handle = null;
    await until(async () => (await fastCall('GET', `/v1/desktops/${id}`)).json.state === 'hibernated', 10_000, 'the force-hibernate');
    // It comes back, and stopping that desktop takes 1.5 s, five times the silence a link is dropped at.
    const hibernate = driver.hibernate.bind(driver);
    driver.hibernate = async (desktopId, options) => {
      await new Promise((resolve) => setTimeout(resolve, 1_500));
      return hibernate(desktopId, options);
    };
    let hellos = 0;
    fast.agents.onHello(() => (hellos += 1));
    handle = await connect(driver);
    await until(async () => (await db`SELECT 1 FROM hosts WHERE status = 'ready'`).length === 1, 10_000, 'the host to be ready');
    expect(hellos).toBe(1);
    expect(driver.desktops.get(id)?.running).toBe(false);
  } finally {
    await handle?.stop();
    await db.end();
    await fast.close();
    rmSync(dir, { recursive: true, force: true });
  }
}, 30_000);
