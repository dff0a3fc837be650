/**
 * A drain lives in the database, not in the leader that runs it: when the leading replica stops
 * mid-drain, the other replica takes the lease, resumes the move that was under way from its
 * recorded phase, and goes on with the desktops still on the host until the host is empty. Two
 * real schedulers on one database, fake agents over real websockets, the source's removal of each
 * moved copy slowed so that the drain is still running when the leader goes.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { adminApi, api, mintKey, startTestScheduler, TEST_ADMIN_TOKEN, until, type TestScheduler } from '../helpers/scheduler.js';
import { slowDestroy, startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { connectDatabase } from '../../scheduler/src/store/db.js';

/** How long the source takes to remove each moved copy. */
const SLOW_MS = 800;
const DESKTOPS = 3;

let first: TestScheduler;
let second: TestScheduler;
const agents: TestAgent[] = [];

beforeAll(async () => {
  first = await startTestScheduler({ CANTO_REPLICA_ID: 'drain-a', CANTO_ADMIN_TOKEN: TEST_ADMIN_TOKEN });
  second = await startTestScheduler(
    { CANTO_REPLICA_ID: 'drain-b', CANTO_ADMIN_TOKEN: TEST_ADMIN_TOKEN, CANTO_SECRET_KEY: first.env.CANTO_SECRET_KEY! },
    first.databaseUrl,
  );
  await until(() => first.leadership.isLeader() !== second.leadership.isLeader(), 5_000, 'one leader');
});

afterAll(async () => {
  for (const agent of agents) await agent.stop();
  await Promise.all([first?.close(), second?.close()]);
});

it('goes on after the leader stops mid-drain, and ends with the host empty and every move settled once', async () => {
  const [leader, follower] = first.leadership.isLeader() ? [first, second] : [second, first];
  // The agents are given the follower: they learn the leader from it and link to both.
  const source = await startFakeAgent(follower.url, { delayMs: 0 });
  agents.push(source);
  const call = api(follower.url, await mintKey(follower.databaseUrl, 'drain-failover'));
  const ids: string[] = [];
  for (let i = 0; i < DESKTOPS; i++) {
    const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
    expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
    ids.push(id);
  }
  for (let i = 0; i < 2; i++) agents.push(await startFakeAgent(follower.url, { delayMs: 0 }));
  const admin = adminApi(follower.url);
  await until(async () => (await admin('GET', '/admin/v1/hosts')).json.hosts.filter((h: { state: string }) => h.state === 'ready').length === 3, 10_000, 'three ready hosts');
  const driver = slowDestroy(source, SLOW_MS);

  expect((await admin('POST', `/admin/v1/hosts/${source.hostId}/drain`, { parallel: 1 })).status).toBe(202);
  // One desktop is on its target (its source copy still being removed): the leader goes now.
  const before = await until(async () => {
    const d = (await admin('GET', `/admin/v1/hosts/${source.hostId}`)).json.drain;
    return d.running + d.moved >= 1 && d.remaining < DESKTOPS - 1 ? d : null;
  }, 10_000, 'the first move under way');
  expect(before).toMatchObject({ state: 'draining' });
  expect(before.moved).toBeLessThan(DESKTOPS);
  // Taken as the old leader begins to stop: its stop hands the lease over first, and the new
  // leader may settle moves while the rest of that stop (a second or two) goes on.
  const handedOver = new Date();
  await leader.close();
  await until(() => follower.leadership.isLeader(), 5_000, 'the follower to lead');

  const drained = await until(async () => {
    const h = (await admin('GET', `/admin/v1/hosts/${source.hostId}`)).json;
    if (h.drain?.state === 'stopped') throw new Error(`drain stopped: ${h.drain.error}`);
    return h.drain?.state === 'drained' ? h : null;
  }, 30_000, 'the drain to finish on the new leader');
  expect(drained.drain).toMatchObject({ moved: DESKTOPS, running: 0, remaining: 0, failed: 0 });
  expect(drained.desktops.total).toBe(0);
  for (const id of ids) {
    const d = (await call('GET', `/v1/desktops/${id}`)).json;
    expect(d.state, id).toBe('awake');
    expect(d.host_id, id).not.toBe(source.hostId);
  }
  expect(driver.desktops.size).toBe(0);
  const sql = connectDatabase(follower.databaseUrl, { max: 1 });
  try {
    const moves = await sql<Array<{ desktop_id: string; state: string; settled_at: Date }>>`
      SELECT desktop_id, state, settled_at FROM operations WHERE kind = 'move' AND params->>'source_host_id' = ${source.hostId}`;
    // One move per desktop, each settled once as succeeded: the one the old leader was running was resumed, not redone.
    expect(moves.map((m) => m.desktop_id).sort()).toEqual([...ids].sort());
    expect(moves.every((m) => m.state === 'succeeded')).toBe(true);
    // The new leader finished what the old one left (moves settled before the handover are the
    // old leader's; one may have settled just after `before` was read).
    const settledBefore = moves.filter((m) => m.settled_at <= handedOver).length;
    expect(settledBefore).toBeLessThanOrEqual(before.moved + 1);
    expect(moves.length - settledBefore).toBeGreaterThanOrEqual(1);
  } finally {
    await sql.end();
  }
});
