/**
 * The idle sweeper against a client changing the desktop between the sweep's read and its
 * request: a PATCH of `idle_timeout_secs` that was answered 200 holds, and so does a wake since.
 * And against desktops it cannot act on: those whose operation is already open do not take the
 * places of those it can.
 * The scheduler's own sweeper is slowed to once an hour; one of the test's own, on the same
 * database and lifecycle service, is stepped by hand with the client's change in between.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { silentLogger } from '../../shared/src/log.js';
import { IDLE_SWEEP_BATCH, IdleSweeper } from '../../scheduler/src/engine/idle-sweeper.js';
import type { LifecycleService } from '../../scheduler/src/services/lifecycle.js';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { api, mintKey, startTestScheduler, type TestScheduler } from '../helpers/scheduler.js';
import { slowDestroy, startFakeAgent, type TestAgent } from '../helpers/agent.js';

let s: TestScheduler;
let sql: Sql;
let agent: TestAgent;
let call: ReturnType<typeof api>;

beforeAll(async () => {
  s = await startTestScheduler({ CANTO_IDLE_SWEEP_MS: '3600000' });
  sql = connectDatabase(s.databaseUrl, { max: 2 });
  agent = await startFakeAgent(s.url, { delayMs: 0 });
  call = api(s.url, await mintKey(s.databaseUrl, 'idle-race'));
});

afterAll(async () => {
  await sql?.end();
  await agent?.stop();
  await s?.close();
});

it('keeps a timeout a PATCH set after the sweep found the desktop idle', async () => {
  const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
  expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
  // Idle for an hour by its timeout of a minute.
  await sql`UPDATE desktops SET idle_timeout_secs = 60, last_woken_at = now() - interval '1 hour' WHERE id = ${id}`;
  // The client turns the timeout off between the sweep's read and its request.
  const lifecycle: Pick<LifecycleService, 'request'> = {
    request: async (...args) => {
      const patched = await call('PATCH', `/v1/desktops/${id}`, { idle_timeout_secs: 0 });
      expect(patched.status).toBe(200);
      return s.lifecycle.request(...args);
    },
  };
  await new IdleSweeper(sql, lifecycle as LifecycleService, 3_600_000, silentLogger(), () => s.leadership.term()).sweep();
  expect((await call('GET', `/v1/desktops/${id}`)).json).toMatchObject({ state: 'awake', idle_timeout_secs: 0 });
  expect(await sql`SELECT 1 FROM operations WHERE desktop_id = ${id} AND reason = 'idle_timeout'`).toHaveLength(0);
});

it('is not held up by idle desktops whose operation is already open', async () => {
  // Destroys that stay open, as they do on a host that went silent: the step waits for it.
  slowDestroy(agent, 60_000);
  const busy: string[] = [];
  for (let i = 0; i < IDLE_SWEEP_BATCH; i++) {
    const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
    expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
    expect((await call('POST', `/v1/desktops/${id}/destroy`)).status).toBe(202);
    busy.push(id);
  }
  const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
  expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
  // All idle past their timeout, the busy ones longest: the first a sweep would look at.
  await sql`UPDATE desktops SET idle_timeout_secs = 60, last_woken_at = now() - interval '2 hours' WHERE id = ANY(${busy})`;
  await sql`UPDATE desktops SET idle_timeout_secs = 60, last_woken_at = now() - interval '1 hour' WHERE id = ${id}`;
  await new IdleSweeper(sql, s.lifecycle, 3_600_000, silentLogger(), () => s.leadership.term()).sweep();
  expect(await sql`SELECT kind FROM operations WHERE desktop_id = ${id} AND reason = 'idle_timeout'`).toEqual([{ kind: 'hibernate' }]);
});
