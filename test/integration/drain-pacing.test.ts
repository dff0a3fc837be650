/**
 * How a drain paces its moves (engine/drainer.ts): `parallel` counts a move until its desktop is
 * on the target, started there if it was awake. What is left of a move then is removing the
 * source's copy, which may take a while on a busy disk: the next move starts beside it instead of
 * after it. The start on the target still counts (it is that desktop's downtime). Real scheduler
 * and database, fake agents over real websockets, the slow steps slowed down by hand.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { adminApi, api, mintKey, startTestScheduler, TEST_ADMIN_TOKEN, until, type TestScheduler } from '../helpers/scheduler.js';
import { slowDestroy, startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { connectDatabase } from '../../scheduler/src/store/db.js';

/** How long the slowed step takes. */
const SLOW_MS = 1_500;

let s: TestScheduler;
let call: ReturnType<typeof api>;
let admin: ReturnType<typeof adminApi>;
const agents: TestAgent[] = [];

beforeAll(async () => {
  s = await startTestScheduler({ CANTO_ADMIN_TOKEN: TEST_ADMIN_TOKEN, CANTO_HEARTBEAT_MS: '200' });
  call = api(s.url, await mintKey(s.databaseUrl, 'pacing'));
  admin = adminApi(s.url);
});

afterAll(async () => {
  for (const agent of agents) await agent.stop();
  await s?.close();
});

/** Two desktops on `source` (the only schedulable host while they are made), awake or not. */
async function twoDesktopsOn(source: TestAgent, awake: boolean): Promise<string[]> {
  const others = agents.filter((a) => a !== source);
  for (const a of others) await admin('POST', `/admin/v1/hosts/${a.hostId}/cordon`);
  const ids: string[] = [];
  for (let i = 0; i < 2; i++) {
    const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
    expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
    if (!awake) expect((await call('POST', `/v1/desktops/${id}/hibernate?wait=true`)).status).toBe(200);
    expect((await call('GET', `/v1/desktops/${id}`)).json.host_id).toBe(source.hostId);
    ids.push(id);
  }
  for (const a of others) await admin('POST', `/admin/v1/hosts/${a.hostId}/uncordon`);
  return ids;
}

/** Drains `source` one move at a time; answers its moves, oldest first. */
async function drainOneByOne(source: TestAgent): Promise<Array<{ desktop_id: string; created_at: Date; settled_at: Date; state: string; result: { source_cleaned: boolean } }>> {
  const started = await admin('POST', `/admin/v1/hosts/${source.hostId}/drain`, { parallel: 1 });
  expect(started.status, started.text).toBe(202);
  const readings: Array<{ moved: number; running: number; remaining: number }> = [];
  await until(async () => {
    const h = (await admin('GET', `/admin/v1/hosts/${source.hostId}`)).json;
    if (h.drain?.state === 'stopped') throw new Error(`drain stopped: ${h.drain.error}`);
    if (h.drain) readings.push({ moved: h.drain.moved, running: h.drain.running, remaining: h.drain.remaining });
    return h.drain?.state === 'drained';
  }, 30_000, 'the drain to finish');
  // Every desktop is counted once at every reading: waiting on the host, in a move, or moved
  // (progress bars take the sum as the whole; a desktop on its target whose source copy was
  // still being removed once counted as none of them).
  expect(readings.filter((r) => r.moved + r.running + r.remaining !== 2)).toEqual([]);
  const sql = connectDatabase(s.databaseUrl, { max: 1 });
  try {
    const moves = await sql<Array<{ desktop_id: string; created_at: Date; settled_at: Date; state: string; result: { source_cleaned: boolean } }>>`
      SELECT desktop_id, created_at, settled_at, state, result FROM operations
      WHERE kind = 'move' AND params->>'source_host_id' = ${source.hostId} ORDER BY created_at`;
    expect(moves.every((m) => m.state === 'succeeded' && m.result.source_cleaned)).toBe(true);
    return moves;
  } finally {
    await sql.end();
  }
}

it('starts the next move while the source still removes the copy of the one before', async () => {
  const source = await startFakeAgent(s.url, { delayMs: 0 });
  agents.push(source, await startFakeAgent(s.url, { delayMs: 0 }));
  const ids = await twoDesktopsOn(source, false);
  const driver = slowDestroy(source, SLOW_MS);
  const moves = await drainOneByOne(source);
  expect(moves.map((m) => m.desktop_id).sort()).toEqual([...ids].sort());
  // One at a time, yet the second began while the first was still removing its source copy.
  expect(moves[1]!.created_at.getTime()).toBeLessThan(moves[0]!.settled_at.getTime());
  // The drain finished only once every source copy was gone.
  expect(driver.desktops.size).toBe(0);
});

it('does not start the next move while the one before still starts its desktop on the target', async () => {
  const source = await startFakeAgent(s.url, { delayMs: 0 });
  agents.push(source);
  const ids = await twoDesktopsOn(source, true);
  // Every host but the source may be the target: each starts slowly, and says when it is done.
  const startedAt = new Map<string, number>();
  for (const target of agents.filter((a) => a !== source && a.driver !== null)) {
    const driver = target.driver!;
    const start = driver.start.bind(driver);
    driver.start = async (spec) => {
      await new Promise((resolve) => setTimeout(resolve, SLOW_MS));
      const result = await start(spec);
      startedAt.set(spec.desktopId, Date.now());
      return result;
    };
  }
  const moves = await drainOneByOne(source);
  const first = moves[0]!.desktop_id;
  expect(moves.map((m) => m.desktop_id).sort()).toEqual([...ids].sort());
  expect(startedAt.has(first)).toBe(true);
  // The second move was created only once the first desktop ran on its target again.
  expect(moves[1]!.created_at.getTime()).toBeGreaterThanOrEqual(startedAt.get(first)!);
  for (const id of ids) expect((await call('GET', `/v1/desktops/${id}`)).json.state).toBe('awake');
});

it('refuses a move onto a host being drained, and takes one onto a host only cordoned', async () => {
  const source = await startFakeAgent(s.url, { delayMs: 0 });
  agents.push(source);
  await twoDesktopsOn(source, false);
  await admin('POST', `/admin/v1/hosts/${source.hostId}/cordon`);
  const elsewhere = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
  await until(async () => (await call('GET', `/v1/desktops/${elsewhere}`)).json.state === 'hibernated', 10_000, 'the desktop placed');
  // Cordoned, not draining: an operator may still send a desktop there by name.
  const onto = await admin('POST', `/admin/v1/desktops/${elsewhere}/move`, { host_id: source.hostId });
  expect(onto.status, onto.text).toBe(202);
  await until(async () => (await admin('GET', `/admin/v1/operations/${onto.json.id}`)).json.state === 'succeeded', 10_000, 'the move');
  const back = await admin('POST', `/admin/v1/desktops/${elsewhere}/move`, {});
  expect(back.status, back.text).toBe(202);
  await until(async () => (await admin('GET', `/admin/v1/operations/${back.json.id}`)).json.state === 'succeeded', 10_000, 'the move back');
  // Each move's removal of its source copy is slow: the drain runs for seconds.
  slowDestroy(source, SLOW_MS);
  expect((await admin('POST', `/admin/v1/hosts/${source.hostId}/drain`, { parallel: 1 })).status).toBe(202);
  const refused = await admin('POST', `/admin/v1/desktops/${elsewhere}/move`, { host_id: source.hostId });
  expect(refused.status, refused.text).toBe(409);
  expect(refused.json.detail).toBe('the target host is being drained; uncordon it first to move desktops onto it');
  await until(async () => (await admin('GET', `/admin/v1/hosts/${source.hostId}`)).json.drain?.state === 'drained', 30_000, 'the drain to finish');
});

it('names a target that is down while the moves to it wait, and goes on once it is back', async () => {
  const source = await startFakeAgent(s.url, { delayMs: 0 });
  let target = await startFakeAgent(s.url, { delayMs: 0 });
  agents.push(source, target);
  await twoDesktopsOn(source, false);
  for (const a of agents.filter((x) => x !== source && x !== target)) await admin('POST', `/admin/v1/hosts/${a.hostId}/cordon`);
  // The target's unpacking is slow, so that its agent can stop in the middle of a copy.
  const driver = target.driver!;
  const unpack = driver.transfer.unpack.bind(driver.transfer);
  (driver.transfer as { unpack: typeof unpack }).unpack = async (...args) => {
    await new Promise((resolve) => setTimeout(resolve, SLOW_MS));
    return unpack(...args);
  };
  expect((await admin('POST', `/admin/v1/hosts/${source.hostId}/drain`, { parallel: 1 })).status).toBe(202);
  const sql = connectDatabase(s.databaseUrl, { max: 1 });
  try {
    await until(async () => (await sql`
      SELECT 1 FROM operations WHERE kind = 'move' AND params->>'source_host_id' = ${source.hostId} AND params->>'phase' = 'stopped'`).length > 0,
    10_000, 'a move copying');
  } finally {
    await sql.end();
  }
  const stateDir = target.stateDir;
  await target.stop(true);
  const waiting = await until(async () => {
    const d = (await admin('GET', `/admin/v1/hosts/${source.hostId}`)).json.drain;
    return d?.down_targets?.length > 0 ? d : null;
  }, 10_000, 'the drain to name its target down');
  expect(waiting).toMatchObject({ state: 'draining', running: 1, down_targets: [target.hostId] });

  target = await startFakeAgent(s.url, { delayMs: 0, again: { stateDir, driver } });
  agents.push(target);
  await until(async () => (await admin('GET', `/admin/v1/hosts/${source.hostId}`)).json.drain?.state === 'drained', 30_000, 'the drain to finish');
  expect((await admin('GET', `/admin/v1/hosts/${source.hostId}`)).json.drain.down_targets).toEqual([]);
}, 60_000);
