/**
 * A drain is driven by what tells the drainer, not by its interval (engine/drainer.ts): a drain
 * asked for on any replica is notified (DRAIN_CHANNEL), and each of its moves landing or settling
 * kicks the leader's drainer. With the poll behind them pushed far away (CANTO_ENGINE_POLL_MS
 * 60 s, which the drainer's interval follows), a drain still starts, paces and ends. It used to
 * wait for the next tick at its start and after its last move: up to 100 ms each, a tenth of
 * the bench's drain. A real scheduler and database, fake agents over real websockets.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { adminApi, api, mintKey, startTestScheduler, TEST_ADMIN_TOKEN, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';

let s: TestScheduler;
let call: ReturnType<typeof api>;
let admin: ReturnType<typeof adminApi>;
const agents: TestAgent[] = [];

beforeAll(async () => {
  // A `?wait=true` answers at 10 s whatever the state: a step left for the 60 s poll shows.
  s = await startTestScheduler({ CANTO_ADMIN_TOKEN: TEST_ADMIN_TOKEN, CANTO_ENGINE_POLL_MS: '60000', CANTO_WAIT_CAP_MS: '10000' });
  call = api(s.url, await mintKey(s.databaseUrl, 'drain-kicks'));
  admin = adminApi(s.url);
});

afterAll(async () => {
  for (const agent of agents) await agent.stop();
  await s?.close();
});

it('starts, paces and ends a drain on notifications alone', async () => {
  const source = await startFakeAgent(s.url, { delayMs: 0 });
  const target = await startFakeAgent(s.url, { delayMs: 0 });
  agents.push(source, target);
  await admin('POST', `/admin/v1/hosts/${target.hostId}/cordon`);
  const ids: string[] = [];
  for (let i = 0; i < 3; i++) {
    const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
    expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).json.state).toBe('succeeded');
    if (i > 0) expect((await call('POST', `/v1/desktops/${id}/hibernate?wait=true`)).json.state).toBe('succeeded');
    ids.push(id);
  }
  await admin('POST', `/admin/v1/hosts/${target.hostId}/uncordon`);
  const started = await admin('POST', `/admin/v1/hosts/${source.hostId}/drain`, { parallel: 1 });
  expect(started.status, started.text).toBe(202);
  // Well inside the poll's 60 s: three moves one after another, and the drain's end.
  const drain = await until(async () => {
    const h = (await admin('GET', `/admin/v1/hosts/${source.hostId}`)).json;
    if (h.drain?.state === 'stopped') throw new Error(`drain stopped: ${h.drain.error}`);
    return h.drain?.state === 'drained' ? h.drain : null;
  }, 20_000, 'the drain to finish');
  expect(drain.moved).toBe(3);
  for (const id of ids) expect((await call('GET', `/v1/desktops/${id}`)).json.host_id).toBe(target.hostId);
  expect((await call('GET', `/v1/desktops/${ids[0]}`)).json.state).toBe('awake');
});
