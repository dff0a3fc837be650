/**
 * A drain stopped by a move that failed is resumed by asking for the drain again, as the runbook,
 * `canto hosts drain` and the API's answer all say: the failure that stopped it no longer counts,
 * the desktop it could not move is tried again, and the drain ends with the host empty. Its
 * progress so far is kept. Real scheduler and database, fake agents over real websockets, the
 * target's install made to fail once by hand.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { adminApi, api, mintKey, startTestScheduler, TEST_ADMIN_TOKEN, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { AgentFailure } from '../../shared/src/protocol.js';

let s: TestScheduler;
let call: ReturnType<typeof api>;
let admin: ReturnType<typeof adminApi>;
let source: TestAgent;
let target: TestAgent;

beforeAll(async () => {
  s = await startTestScheduler({ CANTO_ADMIN_TOKEN: TEST_ADMIN_TOKEN, CANTO_HEARTBEAT_MS: '200' });
  call = api(s.url, await mintKey(s.databaseUrl, 'resume'));
  admin = adminApi(s.url);
  source = await startFakeAgent(s.url, { delayMs: 0 });
  target = await startFakeAgent(s.url, { delayMs: 0 });
});

afterAll(async () => {
  await source?.stop();
  await target?.stop();
  await s?.close();
});

/** The host's drain once it is no longer running. */
async function settledDrain(hostId: string) {
  return until(async () => {
    const drain = (await admin('GET', `/admin/v1/hosts/${hostId}`)).json.drain;
    return drain?.state === 'stopped' || drain?.state === 'drained' ? drain : null;
  }, 30_000, 'the drain to settle');
}

it('resumes a drain stopped by a failed move when the drain is asked for again', async () => {
  await admin('POST', `/admin/v1/hosts/${target.hostId}/cordon`);
  const ids: string[] = [];
  for (let i = 0; i < 2; i++) {
    const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
    await until(async () => (await call('GET', `/v1/desktops/${id}`)).json.state === 'hibernated', 10_000, 'the desktop to be placed');
    ids.push(id);
  }
  await admin('POST', `/admin/v1/hosts/${target.hostId}/uncordon`);

  // The target cannot install the first desktop it is sent; the second goes through.
  const transfer = target.driver!.transfer;
  const install = transfer.install.bind(transfer);
  let failures = 0;
  transfer.install = async (desktopId, spec) => {
    if (failures++ === 0) throw new AgentFailure('runtime_error', 'no space left on the target', false);
    return install(desktopId, spec);
  };
  expect((await admin('POST', `/admin/v1/hosts/${source.hostId}/drain`, { parallel: 1 })).status).toBe(202);
  const stopped = await settledDrain(source.hostId);
  expect(stopped.state).toBe('stopped');
  expect(stopped.error, stopped.error).toMatch(/could not be moved/);
  const before = (await admin('GET', `/admin/v1/hosts/${source.hostId}`)).json.drain;

  // Asked again without `parallel` (what a second `drain --wait` sends): it keeps its own 1, not the default 2.
  const again = await admin('POST', `/admin/v1/hosts/${source.hostId}/drain`, {});
  expect(again.status, again.text).toBe(202);
  expect(again.json.drain.parallel).toBe(1);
  const drained = await settledDrain(source.hostId);
  expect(drained).toMatchObject({ state: 'drained', error: null, remaining: 0 });
  // The same drain, resumed: what it had moved still counts.
  expect(drained.requested_at).toBe(before.requested_at);
  expect(drained.moved).toBe(2);
  // When it was resumed, and no failure since.
  expect(before.resumed_at).toBeNull();
  expect(Date.parse(drained.resumed_at)).toBeGreaterThan(Date.parse(before.requested_at));
  expect(drained.failed).toBe(0);
  for (const id of ids) expect((await call('GET', `/v1/desktops/${id}`)).json.host_id).toBe(target.hostId);
}, 60_000);
