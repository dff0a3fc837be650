/**
 * A database fault the server means to be passing (a serialization failure, a deadlock, a
 * connection it dropped) in the middle of an operation's step is retried, as a step re-driven
 * after a failover is: the wake settles succeeded, and the desktop is not recorded hibernated
 * while its guest runs. Other database errors still end the operation. Real scheduler and
 * database (a trigger injects the fault once), a fake agent over a real websocket.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { api, mintKey, startTestScheduler, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { connectDatabase } from '../../scheduler/src/store/db.js';

let s: TestScheduler;
let agent: TestAgent;
let call: ReturnType<typeof api>;

beforeAll(async () => {
  s = await startTestScheduler();
  agent = await startFakeAgent(s.url);
  call = api(s.url, await mintKey(s.databaseUrl, 'faults'));
});

afterAll(async () => {
  await agent?.stop();
  await s?.close();
});

/** Makes the next commit of a wake (waking → awake) fail once with `sqlstate`. */
async function failNextWakeCommit(sqlstate: string): Promise<void> {
  const sql = connectDatabase(s.databaseUrl, { max: 1 });
  try {
    await sql.unsafe(`
      DROP TRIGGER IF EXISTS fault_once ON desktops;
      DROP SEQUENCE IF EXISTS fault_seq;
      CREATE SEQUENCE fault_seq;
      CREATE OR REPLACE FUNCTION fault_once() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        -- A sequence is not rolled back with the failed transaction: the fault happens once.
        IF nextval('fault_seq') = 1 THEN
          RAISE EXCEPTION 'injected fault' USING ERRCODE = '${sqlstate}';
        END IF;
        RETURN NEW;
      END $$;
      CREATE TRIGGER fault_once BEFORE UPDATE ON desktops
        FOR EACH ROW WHEN (OLD.state = 'waking' AND NEW.state = 'awake') EXECUTE FUNCTION fault_once();`);
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
  await sql`DROP TRIGGER IF EXISTS fault_once ON desktops`;
  await sql.end();
}, 60_000);
