/**
 * How a drain paces its moves (engine/drainer.ts): `parallel` counts moves until they commit.
 * After the commit a move only removes the source's copy, which may take a while on a busy disk;
 * the next move starts beside that cleanup instead of after it. Real scheduler and database, fake
 * agents over real websockets, the source's destroy slowed down.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { adminApi, api, mintKey, startTestScheduler, TEST_ADMIN_TOKEN, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { connectDatabase } from '../../scheduler/src/store/db.js';

/** How long the source takes to remove a moved desktop's copy. */
const CLEANUP_MS = 1_500;

let s: TestScheduler;
const agents: TestAgent[] = [];

beforeAll(async () => {
  s = await startTestScheduler({ CANTO_ADMIN_TOKEN: TEST_ADMIN_TOKEN, CANTO_HEARTBEAT_MS: '200' });
});

afterAll(async () => {
  for (const agent of agents) await agent.stop();
  await s?.close();
});

it('starts the next move once the previous one has committed, while the source still cleans up', async () => {
  const call = api(s.url, await mintKey(s.databaseUrl, 'pacing'));
  const admin = adminApi(s.url);
  // Every desktop lands on the source: it is the only host while they are made.
  const source = await startFakeAgent(s.url, { delayMs: 0 });
  agents.push(source);
  const ids: string[] = [];
  for (let i = 0; i < 2; i++) {
    const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
    expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
    expect((await call('POST', `/v1/desktops/${id}/hibernate?wait=true`)).status).toBe(200);
    ids.push(id);
  }
  agents.push(await startFakeAgent(s.url, { delayMs: 0 }));
  const driver = source.driver!;
  const destroy = driver.destroy.bind(driver);
  driver.destroy = async (desktopId) => {
    await new Promise((resolve) => setTimeout(resolve, CLEANUP_MS));
    return destroy(desktopId);
  };

  const started = await admin('POST', `/admin/v1/hosts/${source.hostId}/drain`, { parallel: 1 });
  expect(started.status, started.text).toBe(202);
  await until(async () => {
    const h = (await admin('GET', `/admin/v1/hosts/${source.hostId}`)).json;
    if (h.drain?.state === 'stopped') throw new Error(`drain stopped: ${h.drain.error}`);
    return h.drain?.state === 'drained';
  }, 30_000, 'the drain to finish');

  const sql = connectDatabase(s.databaseUrl, { max: 1 });
  try {
    const moves = await sql<Array<{ desktop_id: string; created_at: Date; settled_at: Date; state: string; result: { source_cleaned: boolean } }>>`
      SELECT desktop_id, created_at, settled_at, state, result FROM operations
      WHERE kind = 'move' AND params->>'source_host_id' = ${source.hostId} ORDER BY created_at`;
    expect(moves.map((m) => m.desktop_id).sort()).toEqual([...ids].sort());
    expect(moves.every((m) => m.state === 'succeeded' && m.result.source_cleaned)).toBe(true);
    // One at a time, yet the second began while the first was still removing its source copy.
    expect(moves[1]!.created_at.getTime()).toBeLessThan(moves[0]!.settled_at.getTime());
  } finally {
    await sql.end();
  }
  // The drain finished only once every source copy was gone.
  expect(driver.desktops.size).toBe(0);
});
