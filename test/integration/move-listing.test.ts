/**
 * How the scheduler asks for a move's listing (engine/move.ts, protocol 1.10): between agents that
 * both speak 1.10 the source lists its units by size and reads each once, for the copy; when
 * either agent is older, the listing is hashed, which reads every unit once more before the
 * first byte moves (the older agent would not know a listing without hashes). Between agents
 * that both speak 1.12 an awake desktop is pre-copied first (shared/src/precopy.ts); with an
 * older agent on either side, it is not. Agents of 1.13, 1.14 and 1.15 dump memory snapshots older
 * ones could not wake: moves from such an agent go to none older than its snapshot format, asked
 * for or chosen.
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { adminApi, api, mintKey, startTestScheduler, TEST_ADMIN_TOKEN, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { snapshotFormat } from '../../shared/src/protocol.js';

let s: TestScheduler;
const agents: TestAgent[] = [];

beforeAll(async () => {
  // A move that finds no host waits this long for one before it fails.
  s = await startTestScheduler({ CANTO_ADMIN_TOKEN: TEST_ADMIN_TOKEN, CANTO_HEARTBEAT_MS: '200', CANTO_CAPACITY_WAIT_MS: '500' });
});

afterAll(async () => {
  for (const agent of agents) await agent.stop();
  await s?.close();
});

/** Replaces the agents with new ones speaking these protocols (undefined: this build's), once all are ready. */
async function agentsSpeaking(protocols: Array<string | undefined>): Promise<TestAgent[]> {
  for (const agent of agents.splice(0)) await agent.stop();
  // Agents of our own driver (delayMs), so a test can watch the transfer.
  for (const protocol of protocols) agents.push(await startFakeAgent(s.url, { delayMs: 0, protocol }));
  const admin = adminApi(s.url);
  await until(async () => {
    const hosts = (await admin('GET', '/admin/v1/hosts')).json.hosts as Array<{ id: string; state: string }>;
    return agents.every((a) => hosts.some((h) => h.id === a.hostId && h.state === 'ready'));
  }, 10_000, 'every host ready');
  return [...agents];
}

/**
 * Moves a new desktop from one agent to the other and answers how often the source's transfer
 * read and counted units.
 */
async function moveBetween(protocols: [string | undefined, string | undefined]): Promise<{ reads: number; sizes: number; precopies: number }> {
  await agentsSpeaking(protocols);
  const call = api(s.url, await mintKey(s.databaseUrl, 'listing'));
  const admin = adminApi(s.url);
  const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
  expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
  const hostId = (await call('GET', `/v1/desktops/${id}`)).json.host_id as string;
  const source = agents.find((a) => a.hostId === hostId)!;
  const transfer = source.driver!.transfer!;
  const seen = { reads: 0, sizes: 0, precopies: 0 };
  // The fake runtime has no pre-copy of its own: one that picks no file, counting its scans.
  const scan = async () => {
    seen.precopies++;
    return [];
  };
  Object.assign(transfer, { precopy: { scan } });
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
  expect((await call('GET', `/v1/desktops/${id}`)).json.host_id).not.toBe(hostId);
  // The phase shows for operators (and the bench) exactly when a pre-copy ran.
  expect(op.result.phase_ms.precopied !== undefined).toBe(seen.precopies > 0);
  // The copy's time is kept though the phase is written only with the commit.
  expect(op.result.phase_ms.copied).toBeGreaterThanOrEqual(0);
  expect(op.result.phase_ms.committed).toBeGreaterThanOrEqual(0);
  return seen;
}

it('lists units by size between agents of 1.10, so the source reads the desktop once', async () => {
  // One unit (the fake desktop): counted once, read once for the copy, never hashed beforehand.
  expect(await moveBetween([undefined, undefined])).toEqual({ reads: 1, sizes: 1, precopies: 1 });
});

it('lists units with their hashes when either agent is older than 1.10', async () => {
  // Read once to hash it for the listing, once more for the copy; never counted alone.
  // (The other agent is older than 1.13 too, so a move may go either way: see the last test.)
  expect(await moveBetween(['1.9', '1.12'])).toEqual({ reads: 2, sizes: 0, precopies: 0 });
  expect(await moveBetween(['1.12', '1.9'])).toEqual({ reads: 2, sizes: 0, precopies: 0 });
});

it('pre-copies an awake desktop only when both agents speak 1.12', async () => {
  expect((await moveBetween(['1.11', '1.12'])).precopies).toBe(0);
  expect((await moveBetween(['1.12', '1.11'])).precopies).toBe(0);
  expect((await moveBetween(['1.12', '1.12'])).precopies).toBe(1);
});

it('reads the newest snapshot format an agent dumps from the protocol it speaks', () => {
  const upTo = (newest: number) => (minor: number) => minor <= newest;
  expect([12, 13, 14, 15, 16].map((newest) => snapshotFormat(upTo(newest)))).toEqual([0, 13, 14, 15, 15]);
});

it('moves nothing from a current agent to one of 1.13 (an older snapshot format), and everything the other way', async () => {
  const [current, older] = (await agentsSpeaking([undefined, '1.13'])) as [TestAgent, TestAgent];
  const call = api(s.url, await mintKey(s.databaseUrl, 'versions'));
  const admin = adminApi(s.url);
  // Placement spreads: two desktops, one on each host.
  const on = new Map<string, string>();
  for (let i = 0; i < 2; i++) {
    const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
    expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
    on.set((await call('GET', `/v1/desktops/${id}`)).json.host_id as string, id);
  }
  expect(on.size).toBe(2);
  const move = async (id: string, body: object) => {
    const requested = await admin('POST', `/admin/v1/desktops/${id}/move`, body);
    expect(requested.status, requested.text).toBe(202);
    return until(async () => {
      const o = (await admin('GET', `/admin/v1/operations/${requested.json.id}`)).json;
      return o.state === 'succeeded' || o.state === 'failed' ? o : null;
    }, 20_000, 'the move to settle');
  };
  const fromCurrent = on.get(current.hostId)!;
  for (const body of [{ host_id: older.hostId }, {}]) {
    const op = await move(fromCurrent, body);
    expect(op.state).toBe('failed');
    expect(JSON.stringify(op.error)).toMatch(body.host_id === undefined ? /no other host is up.*1 more run an agent older than protocol 1\.15/ : /older than protocol 1\.15/);
    expect((await call('GET', `/v1/desktops/${fromCurrent}`)).json).toMatchObject({ host_id: current.hostId, state: 'awake' });
  }
  const op = await move(on.get(older.hostId)!, {});
  expect(op.state, JSON.stringify(op.error)).toBe('succeeded');
  expect((await call('GET', `/v1/desktops/${on.get(older.hostId)!}`)).json.host_id).toBe(current.hostId);
});

it('refuses up front a drain that only older agents could take', async () => {
  const [current, older] = (await agentsSpeaking([undefined, '1.12'])) as [TestAgent, TestAgent];
  const call = api(s.url, await mintKey(s.databaseUrl, 'drain-versions'));
  const admin = adminApi(s.url);
  expect((await admin('POST', `/admin/v1/hosts/${older.hostId}/cordon`)).status).toBe(200);
  const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
  expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
  expect((await admin('POST', `/admin/v1/hosts/${older.hostId}/uncordon`)).status).toBe(200);
  expect((await call('GET', `/v1/desktops/${id}`)).json.host_id).toBe(current.hostId);
  const refused = await admin('POST', `/admin/v1/hosts/${current.hostId}/drain`, {});
  expect(refused.status, refused.text).toBe(409);
  expect(refused.json.detail, refused.json.detail).toMatch(/1 other hosts run an agent older than protocol 1\.15/);
  // Nothing changed: the host is not cordoned, and the desktop is where it was.
  const host = (await admin('GET', `/admin/v1/hosts/${current.hostId}`)).json;
  expect(host.schedulable).toBe(true);
  expect((await call('GET', `/v1/desktops/${id}`)).json).toMatchObject({ host_id: current.hostId, state: 'awake' });
});
