/**
 * The engine starts an operation when its notification arrives, also when the notification
 * comes while the engine is busy claiming others: a burst of wakes settles with the poll that
 * backs the notifications far away (CANTO_ENGINE_POLL_MS 60 s). A kick that came during a tick
 * used to be dropped, and its operation waited for the poll: up to 500 ms by default, for any
 * request of a burst. A real scheduler and an in-process agent on the FakeDriver.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { api, mintKey, startTestScheduler, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';

let s: TestScheduler;
let agent: TestAgent;
let call: ReturnType<typeof api>;

beforeAll(async () => {
  // A `?wait=true` answers at 10 s whatever the state: an operation left for the 60 s poll shows.
  s = await startTestScheduler({ CANTO_ENGINE_POLL_MS: '60000', CANTO_WAIT_CAP_MS: '10000' });
  agent = await startFakeAgent(s.url);
  call = api(s.url, await mintKey(s.databaseUrl, 'kicks'));
});

afterAll(async () => {
  await agent?.stop();
  await s?.close();
});

it('starts every operation of a burst on its notification, none left for the poll', async () => {
  const ids: string[] = [];
  for (let i = 0; i < 24; i++) ids.push((await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string);
  for (let round = 0; round < 3; round++) {
    const woken = await Promise.all(ids.map((id) => call('POST', `/v1/desktops/${id}/wake?wait=true`)));
    expect(woken.map((r) => r.json?.state)).toEqual(ids.map(() => 'succeeded'));
    const slept = await Promise.all(ids.map((id) => call('POST', `/v1/desktops/${id}/hibernate?wait=true`)));
    expect(slept.map((r) => r.json?.state)).toEqual(ids.map(() => 'succeeded'));
  }
});
