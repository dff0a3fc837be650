/**
 * A leader whose own view of its lease lapses for a moment (a renewal slower than the lease's
 * margin, as on a busy database) and then renews it in the same term goes on driving the
 * operations it had started: they are this term's to finish, and no other leader will re-drive
 * them while the term lasts. Real scheduler and database, a fake agent over a real websocket.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { api, mintKey, startTestScheduler, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';

let s: TestScheduler;
let agent: TestAgent;
let call: ReturnType<typeof api>;

beforeAll(async () => {
  s = await startTestScheduler();
  agent = await startFakeAgent(s.url);
  call = api(s.url, await mintKey(s.databaseUrl, 'lapse'));
});

afterAll(async () => {
  await agent?.stop();
  await s?.close();
});

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
