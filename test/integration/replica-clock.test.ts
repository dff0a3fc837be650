/**
 * A replica whose clock is off from the database's measures ages against the times the database
 * recorded on the database's clock (store/db-clock.ts): a replica ten minutes ahead still gives an
 * operation its retries up to the deadline, counted from when the database says it started, and
 * a move's stop is recorded at the database's time. Real scheduler (in this process, its wall
 * clock moved ahead) and database, a fake agent over a real websocket.
 */
import { afterAll, beforeAll, expect, it, vi } from 'vitest';
import { AgentFailure } from '../../shared/src/protocol.js';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { adminApi, api, mintKey, settledOperation, startTestScheduler, TEST_ADMIN_TOKEN, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';

/** How far ahead this process's wall clock runs, against the database's. */
const SKEW_MS = 10 * 60_000;

let s: TestScheduler;
let sql: Sql;
let call: ReturnType<typeof api>;
let admin: ReturnType<typeof api>;
const agents: TestAgent[] = [];

beforeAll(async () => {
  vi.useFakeTimers({ toFake: ['Date'], shouldAdvanceTime: true });
  vi.setSystemTime(Date.now() + SKEW_MS);
  s = await startTestScheduler({ CANTO_ADMIN_TOKEN: TEST_ADMIN_TOKEN, CANTO_HEARTBEAT_MS: '200', CANTO_OPERATION_DEADLINE_MS: '5000' });
  sql = connectDatabase(s.databaseUrl, { max: 1 });
  call = api(s.url, await mintKey(s.databaseUrl, 'clock'));
  admin = adminApi(s.url);
  for (let i = 0; i < 2; i++) agents.push(await startFakeAgent(s.url, { delayMs: 0 }));
});

afterAll(async () => {
  for (const agent of agents) await agent.stop().catch(() => undefined);
  await sql?.end();
  await s?.close();
  vi.useRealTimers();
});

it('retries a failed start up to the deadline however far ahead the replica\'s clock runs', async () => {
  const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
  await until(async () => (await call('GET', `/v1/desktops/${id}`)).json.state === 'hibernated', 10_000, 'the desktop to be placed');
  const host = (await call('GET', `/v1/desktops/${id}`)).json.host_id as string;
  const driver = agents.find((a) => a.hostId === host)!.driver!;
  const start = driver.start.bind(driver);
  let failed = 0;
  driver.start = async (spec) => {
    if (failed++ === 0) throw new AgentFailure('runtime_error', 'the desktop did not boot', true);
    return start(spec);
  };
  const woke = await call('POST', `/v1/desktops/${id}/wake?wait=true`);
  expect(woke.status, woke.text).toBe(200);
  expect(woke.json).toMatchObject({ state: 'succeeded' });
  expect(failed).toBe(2);
  driver.start = start;

  // A move's stop is recorded at the database's time, not ten minutes ahead of it.
  const target = agents.find((a) => a.hostId !== host)!;
  const moved = await admin('POST', `/admin/v1/desktops/${id}/move`, { host_id: target.hostId });
  expect(moved.status, moved.text).toBe(202);
  const op = await settledOperation(admin, moved.json.id as string);
  expect(op.state, JSON.stringify(op.error)).toBe('succeeded');
  const [row] = await sql<Array<{ stopped_at: string; now: Date }>>`SELECT params->>'stopped_at' AS stopped_at, now() AS now FROM operations WHERE id = ${moved.json.id}`;
  expect(Math.abs(row!.now.getTime() - Date.parse(row!.stopped_at))).toBeLessThan(SKEW_MS / 2);
}, 60_000);
