/**
 * An operation's step interrupted by something passing is finished, not dropped or failed:
 * - a database fault the server means to be passing (a serialization failure, a deadlock, a
 *   connection it dropped) is retried, as a step re-driven after a failover is: the wake settles
 *   succeeded, and the desktop is not recorded hibernated while its guest runs. Other database
 *   errors still end the operation (a trigger injects the fault once);
 * - a leader whose own view of its lease lapses for a moment (a renewal slower than the lease's
 *   margin, as on a busy database) and then renews it in the same term goes on driving the
 *   operations it had started: no other leader will re-drive them while the term lasts.
 * Real scheduler and database, a fake agent over a real websocket.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { api, mintKey, startTestScheduler, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { connectDatabase } from '../../scheduler/src/store/db.js';
import { clearDesktopsFault, failDesktopsOnce } from '../helpers/db-faults.js';

let s: TestScheduler;
let agent: TestAgent;
let call: ReturnType<typeof api>;

beforeAll(async () => {
  s = await startTestScheduler();
  agent = await startFakeAgent(s.url);
  call = api(s.url, await mintKey(s.databaseUrl, 'interrupted'));
});

afterAll(async () => {
  await agent?.stop();
  await s?.close();
});

/** Makes the next commit of a wake (waking → awake) fail once with `sqlstate`. */
async function failNextWakeCommit(sqlstate: string): Promise<void> {
  const sql = connectDatabase(s.databaseUrl, { max: 1 });
  try {
    await failDesktopsOnce(sql, sqlstate, 'UPDATE', "OLD.state = 'waking' AND NEW.state = 'awake'");
  } finally {
    await sql.end();
  }
}

it('retries a step a passing database fault cut short, and the wake settles succeeded', async () => {
  for (const sqlstate of ['40001', '40P01', '57P01']) {
    const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
    await failNextWakeCommit(sqlstate);
    const woke = await call('POST', `/v1/desktops/${id}/wake?wait=true`);
    expect(woke.status, `${sqlstate}: ${woke.text}`).toBe(200);
    expect(woke.json.state, sqlstate).toBe('succeeded');
    expect((await call('GET', `/v1/desktops/${id}`)).json.state).toBe('awake');
  }
}, 60_000);

it('still ends the operation on an error that is not passing', async () => {
  const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
  await failNextWakeCommit('23514');
  const woke = await call('POST', `/v1/desktops/${id}/wake?wait=true`);
  expect(woke.status, woke.text).toBe(409);
  const sql = connectDatabase(s.databaseUrl, { max: 1 });
  await clearDesktopsFault(sql);
  await sql.end();
}, 60_000);

it('finishes an operation begun while its lease looked lapsed, once the same term renews', async () => {
  const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
  expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
  const epoch = s.leadership.term()!.epoch;

  // The renewal is late: for 600 ms this replica cannot tell that it still leads.
  const term = s.leadership.term.bind(s.leadership);
  s.leadership.term = () => null;
  const hibernating = call('POST', `/v1/desktops/${id}/hibernate?wait=true`);
  await new Promise((r) => setTimeout(r, 600));
  s.leadership.term = term;

  const settled = await hibernating;
  expect(settled.status, settled.text).toBe(200);
  expect(settled.json).toMatchObject({ kind: 'hibernate', state: 'succeeded' });
  expect(s.leadership.term()!.epoch).toBe(epoch);
  expect((await call('GET', `/v1/desktops/${id}`)).json.state).toBe('hibernated');
}, 30_000);
