/**
 * Stale copies on a returning host (scheduler/src/engine/stale-copies.ts): a move whose source
 * went away right after the commit leaves the source's copy behind (the operation says
 * `source_cleaned: false`); when that host links again, the leader destroys the copy, and only
 * that one. Fake agents over real websockets on a real scheduler and database.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { adminApi, api, mintKey, startTestScheduler, TEST_ADMIN_TOKEN, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';


let s: TestScheduler;
let call: ReturnType<typeof api>;
let admin: ReturnType<typeof api>;
const agents: TestAgent[] = [];

/** Whether the host's current driver holds the desktop (the agent in `agents` for that host id). */
async function holds(agent: TestAgent, desktopId: string): Promise<boolean> {
  const current = agents.find((a) => a.hostId === agent.hostId) ?? agent;
  return (await current.driver!.list()).some((d) => d.desktopId === desktopId);
}

beforeAll(async () => {
  s = await startTestScheduler({ CANTO_ADMIN_TOKEN: TEST_ADMIN_TOKEN, CANTO_HEARTBEAT_MS: '200' });
  call = api(s.url, await mintKey(s.databaseUrl, 'stale'));
  admin = adminApi(s.url);
  // A delay on every lifecycle call leaves time to take the source away between commit and cleanup.
  for (let i = 0; i < 2; i++) agents.push(await startFakeAgent(s.url, { delayMs: 300 }));
});

afterAll(async () => {
  for (const agent of agents) await agent.stop();
  await s?.close();
});

describe('a copy left on a host that was away when its desktop moved', () => {
  it('is destroyed when the host links again, and the moved desktop is untouched', async () => {
    const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
    expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).json.state).toBe('succeeded');
    const sourceId = (await call('GET', `/v1/desktops/${id}`)).json.host_id as string;
    const source = agents.find((a) => a.hostId === sourceId)!;
    const target = agents.find((a) => a !== source)!;

    const asked = await admin('POST', `/admin/v1/desktops/${id}/move`, { host_id: target.hostId });
    expect(asked.status, asked.text).toBe(202);
    // Committed on the target: the source goes away before the move can clean it up.
    await until(async () => (await admin('GET', `/admin/v1/operations/${asked.json.id}`)).json.phase === 'committed', 20_000, 'the commit');
    const { stateDir, driver } = source;
    await source.stop(true);
    const op = await until(async () => {
      const o = (await admin('GET', `/admin/v1/operations/${asked.json.id}`)).json;
      return o.state === 'succeeded' || o.state === 'failed' ? o : null;
    }, 30_000, 'the move to settle');
    expect(op.state, JSON.stringify(op)).toBe('succeeded');
    expect(op.result.source_cleaned).toBe(false);
    expect(await holds(source, id)).toBe(true);

    // The source links again: its copy goes; the desktop stays awake on the target.
    agents[agents.indexOf(source)] = await startFakeAgent(s.url, { again: { stateDir, driver: driver! } });
    await until(async () => !(await holds(source, id)), 15_000, 'the stale copy to go');
    expect(await holds(target, id)).toBe(true);
    const d = (await call('GET', `/v1/desktops/${id}`)).json;
    expect([d.state, d.host_id]).toEqual(['awake', target.hostId]);
  });

  it("keeps the host's own desktops", async () => {
    const mine = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
    await until(async () => (await call('GET', `/v1/desktops/${mine}`)).json.host_id, 10_000, 'placement');
    const hostId = (await call('GET', `/v1/desktops/${mine}`)).json.host_id as string;
    const host = agents.find((a) => a.hostId === hostId)!;
    const { stateDir, driver } = host;
    await host.stop(true);
    agents[agents.indexOf(host)] = await startFakeAgent(s.url, { again: { stateDir, driver: driver! } });
    // A hello later, nothing of its own went.
    await new Promise((r) => setTimeout(r, 500));
    expect(await holds(host, mine)).toBe(true);
  });
});
