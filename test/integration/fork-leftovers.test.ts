/**
 * The copies a failed fork leaves on its source's host go, whatever happened to the removal the
 * failure sent: removes that came while the fork was still copying (the scheduler gave up on it)
 * are caught up by the agent once the copying ends, and copies the removal could not reach are
 * swept when the host next says hello. Real scheduler and database, a fake agent over a real
 * websocket.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { AgentFailure } from '../../shared/src/protocol.js';
import { api, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';

let s: TestScheduler;
let sql: Sql;
let call: ReturnType<typeof api>;
let agent: TestAgent;

beforeAll(async () => {
  // A fork command times out after 2 × 500 ms, and is not retried past 1 s.
  s = await startTestScheduler({ CANTO_AGENT_TIMEOUT_MS: '500', CANTO_OPERATION_DEADLINE_MS: '1000' });
  sql = connectDatabase(s.databaseUrl, { max: 1 });
  call = api(s.url, await mintKey(s.databaseUrl, 'fork-leftovers'));
  agent = await startFakeAgent(s.url, { delayMs: 0 });
});

afterAll(async () => {
  await sql?.end();
  await agent?.stop();
  await s?.close();
});

async function hibernatedDesktop(): Promise<string> {
  const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
  expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
  expect((await call('POST', `/v1/desktops/${id}/hibernate?wait=true`)).status).toBe(200);
  return id;
}

/** Forks `id` twice and waits for the fork to fail; the ids it was to make. */
async function failedFork(id: string): Promise<string[]> {
  const asked = await call('POST', `/v1/desktops/${id}/fork`, { count: 2, acknowledge_shared_state: true });
  expect(asked.status, asked.text).toBe(202);
  const op = await until(async () => {
    const o = (await call('GET', `/v1/operations/${asked.json.id}`)).json;
    return o.state === 'failed' || o.state === 'succeeded' ? o : null;
  }, 20_000, 'the fork to settle');
  expect(op.state).toBe('failed');
  const [row] = await sql<Array<{ ids: string[] }>>`SELECT params->'desktop_ids' AS ids FROM operations WHERE id = ${asked.json.id}`;
  return row!.ids;
}

it('removes the copies of a fork given up on while it was still copying, once the copying ends', async () => {
  const id = await hibernatedDesktop();
  const driver = agent.driver!;
  const fork = driver.fork.bind(driver);
  driver.fork = async (source, ids) => {
    await new Promise((resolve) => setTimeout(resolve, 2_000));
    return fork(source, ids);
  };
  try {
    const ids = await failedFork(id);
    // The copying ends after the fork failed and its removals came and went.
    await new Promise((resolve) => setTimeout(resolve, 2_500));
    expect(ids.filter((f) => driver.desktops.has(f))).toEqual([]);
  } finally {
    driver.fork = fork;
  }
}, 30_000);

it('sweeps the copies a failed fork left where its removal could not reach, at the next hello', async () => {
  const id = await hibernatedDesktop();
  const driver = agent.driver!;
  const { fork, destroy } = driver;
  // The copies are made, the fork fails, and the removals fail too.
  driver.fork = async (source, ids) => {
    await fork.call(driver, source, ids);
    throw new AgentFailure('runtime_error', 'the fork failed after copying', false);
  };
  driver.destroy = async () => {
    throw new AgentFailure('runtime_error', 'the disk is busy', true);
  };
  const ids = await failedFork(id);
  driver.fork = fork;
  driver.destroy = destroy;
  expect(ids.filter((f) => driver.desktops.has(f))).toEqual(ids);
  // The host says hello again (its agent restarted): the copies go, the source stays.
  const { stateDir } = agent;
  await agent.stop(true);
  agent = await startFakeAgent(s.url, { again: { stateDir, driver } });
  const held = agent.driver!.desktops;
  await until(() => ids.every((f) => !held.has(f)), 10_000, 'the leftovers to be swept');
  expect(held.has(id)).toBe(true);
  expect((await call('GET', `/v1/desktops/${id}`)).json.state).toBe('hibernated');
}, 30_000);
