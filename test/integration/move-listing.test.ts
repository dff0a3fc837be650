/**
 * How the scheduler asks for a move's listing (engine/move.ts, protocol 1.10): between agents that
 * both speak 1.10 the source lists its units by size and reads each once, for the copy; a hashed
 * listing would read every unit once more, to hash it, before the first byte moved.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { adminApi, api, mintKey, startTestScheduler, TEST_ADMIN_TOKEN, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';

let s: TestScheduler;
const agents: TestAgent[] = [];

beforeAll(async () => {
  s = await startTestScheduler({ CANTO_ADMIN_TOKEN: TEST_ADMIN_TOKEN, CANTO_HEARTBEAT_MS: '200' });
  // A driver of our own (delayMs), so the test can watch what the transfer reads.
  for (let i = 0; i < 2; i++) agents.push(await startFakeAgent(s.url, { delayMs: 0 }));
});

afterAll(async () => {
  for (const agent of agents) await agent.stop();
  await s?.close();
});

it('lists units by size between agents of 1.10, so the source reads the desktop once', async () => {
  const call = api(s.url, await mintKey(s.databaseUrl, 'listing'));
  const admin = adminApi(s.url);
  const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
  expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
  const hostId = (await call('GET', `/v1/desktops/${id}`)).json.host_id as string;
  const source = agents.find((a) => a.hostId === hostId)!;
  const transfer = source.driver!.transfer!;
  const seen = { reads: 0, sizes: 0 };
  const read = transfer.read.bind(transfer);
  const size = transfer.size!.bind(transfer);
  transfer.read = (desktopId, unitId) => {
    seen.reads++;
    return read(desktopId, unitId);
  };
  transfer.size = (desktopId, unitId) => {
    seen.sizes++;
    return size(desktopId, unitId);
  };

  const requested = await admin('POST', `/admin/v1/desktops/${id}/move`, {});
  expect(requested.status, requested.text).toBe(202);
  const op = await until(async () => {
    const o = (await admin('GET', `/admin/v1/operations/${requested.json.id}`)).json;
    return o.state === 'succeeded' || o.state === 'failed' ? o : null;
  }, 20_000, 'the move to settle');
  expect(op.state, JSON.stringify(op.error)).toBe('succeeded');
  // One unit (the fake desktop): counted once, read once for the copy, never hashed beforehand.
  expect(seen).toEqual({ reads: 1, sizes: 1 });
});
