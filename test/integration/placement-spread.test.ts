/**
 * Placement spreads a burst of creates: 12 desktops created at once over 3 equal hosts (fake
 * agents over real websockets) land 4/4/4, though none of them is awake and all are placed while
 * the others are still in flight. A drain's moves running side by side spread the same way.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { adminApi, api, mintKey, startTestScheduler, TEST_ADMIN_TOKEN, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { connectDatabase } from '../../scheduler/src/store/db.js';

let s: TestScheduler;
let acme: ReturnType<typeof api>;
const agents: TestAgent[] = [];

beforeAll(async () => {
  // Placement is what is measured, not host health: a loaded machine must not read a host down.
  s = await startTestScheduler({ CANTO_HOST_DOWN_MS: '15000', CANTO_ADMIN_TOKEN: TEST_ADMIN_TOKEN });
  acme = api(s.url, await mintKey(s.databaseUrl, 'acme'));
  // A delay on every lifecycle call keeps each placement in flight while the others are chosen.
  for (let i = 0; i < 3; i++) agents.push(await startFakeAgent(s.url, { delayMs: 50 }));
  // An agent is linked once it said hello; the scheduler reads its host ready a message later.
  const sql = connectDatabase(s.databaseUrl, { max: 1 });
  try {
    await until(async () => (await sql<Array<{ n: number }>>`SELECT count(*)::int AS n FROM hosts WHERE status = 'ready'`)[0]!.n === 3, 10_000, 'three ready hosts');
  } finally {
    await sql.end();
  }
});

afterAll(async () => {
  for (const a of agents) await a.stop();
  await s?.close();
});

describe('placement', () => {
  it('spreads 12 desktops created at once over 3 equal hosts 4/4/4', async () => {
    const created = await Promise.all(Array.from({ length: 12 }, () => acme('POST', '/v1/desktops', { tier: 'small' })));
    for (const res of created) expect(res.status).toBe(201);
    const ids = created.map((r) => r.json.id as string);
    const placed: any[] = await until(async () => {
      const desktops = await Promise.all(ids.map(async (id) => (await acme('GET', `/v1/desktops/${id}`)).json));
      return desktops.every((d) => d.state === 'hibernated') ? desktops : null;
    }, 20_000, 'every desktop placed');
    const perHost: Record<string, number> = Object.fromEntries(agents.map((a) => [a.hostId, 0]));
    for (const d of placed) perHost[d.host_id]!++;
    expect(Object.values(perHost).sort(), JSON.stringify(perHost)).toEqual([4, 4, 4]);
  });

  it('spreads the awake desktops a drain moves side by side over the other hosts', async () => {
    const [source, ...others] = agents.map((a) => a.hostId);
    const mine = (await acme('GET', '/v1/desktops')).json.desktops.filter((d: any) => d.host_id === source).map((d: any) => d.id as string);
    expect(mine).toHaveLength(4);
    for (const id of mine) expect((await acme('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
    const admin = adminApi(s.url);
    const started = await admin('POST', `/admin/v1/hosts/${source}/drain`, { parallel: 4 });
    expect(started.status, started.text).toBe(202);
    await until(async () => {
      const h = (await admin('GET', `/admin/v1/hosts/${source}`)).json;
      if (h.drain?.state === 'stopped') throw new Error(`drain stopped: ${h.drain.error}`);
      return h.drain?.state === 'drained';
    }, 20_000, 'the drain to finish');
    const perHost: Record<string, number> = Object.fromEntries(others.map((h) => [h, 0]));
    for (const id of mine) {
      const d = (await acme('GET', `/v1/desktops/${id}`)).json;
      expect(d.state).toBe('awake');
      perHost[d.host_id]!++;
    }
    // Each move is chosen while the others are in flight (copying while their desktops still run).
    expect(Object.values(perHost).sort(), JSON.stringify(perHost)).toEqual([2, 2]);
  });
});
