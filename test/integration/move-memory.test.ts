/**
 * A move keeps an awake desktop's memory or does not move it, and says which it did:
 * - the move's stop asks the source to keep the desktop running should its memory snapshot fail
 *   (desktop.hibernate `require_snapshot`, protocol 1.17); such a stop fails, and the move goes
 *   back with the desktop awake on its source, its programs running, nothing on the target, and
 *   no lifecycle event or meter change for its org. A move used to stop it cold and carry on;
 * - `memory_snapshot` in the move's result is true only when the target restored that memory:
 *   a target that booted the desktop cold (it could not restore it) made it read true.
 * Real scheduler and database, fake agents over real websockets.
 */
import { afterAll, beforeAll, beforeEach, expect, it } from 'vitest';
import { AgentFailure } from '../../shared/src/protocol.js';
import { adminApi, api, mintKey, moveSettled, startTestScheduler, TEST_ADMIN_TOKEN, type TestScheduler } from '../helpers/scheduler.js';
import { awakeOnOneOf, startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';

let s: TestScheduler;
let sql: Sql;
let call: ReturnType<typeof api>;
let admin: ReturnType<typeof api>;
const agents: TestAgent[] = [];
/** The drivers' own methods, put back before each test. */
const originals: Array<() => void> = [];

beforeAll(async () => {
  s = await startTestScheduler({ CANTO_ADMIN_TOKEN: TEST_ADMIN_TOKEN, CANTO_HEARTBEAT_MS: '200' });
  sql = connectDatabase(s.databaseUrl, { max: 2 });
  call = api(s.url, await mintKey(s.databaseUrl, 'move-memory'));
  admin = adminApi(s.url);
  for (let i = 0; i < 2; i++) {
    const agent = await startFakeAgent(s.url, { delayMs: 0 });
    agents.push(agent);
    const driver = agent.driver!;
    const { start, hibernate } = driver;
    originals.push(() => {
      driver.start = start;
      driver.hibernate = hibernate;
    });
  }
});

beforeEach(() => {
  for (const restore of originals) restore();
});

afterAll(async () => {
  await sql?.end();
  for (const agent of agents) await agent.stop();
  await s?.close();
});

const awakeDesktop = () => awakeOnOneOf(call, agents);
const moveTo = (id: string, target: TestAgent): Promise<any> => moveSettled(admin, id, target.hostId);

/** The desktop's meter intervals and lifecycle events, as its org would see them. */
async function billing(id: string) {
  const meters = await sql<Array<{ started_at: Date; ended_at: Date | null }>>`
    SELECT started_at, ended_at FROM meter_intervals WHERE desktop_id = ${id} ORDER BY started_at`;
  const events = await sql<Array<{ type: string }>>`SELECT type FROM outbox WHERE desktop_id = ${id} ORDER BY id`;
  return { meters: [...meters], events: events.map((e) => e.type) };
}

it('leaves an awake desktop whose memory cannot be saved running on its source, and the move fails', async () => {
  const { id, source, target } = await awakeDesktop();
  const before = await billing(id);
  const driver = source.driver!;
  const hibernate = driver.hibernate.bind(driver);
  // What an agent of 1.17 does when both dumps fail: the guest runs on, the command fails.
  driver.hibernate = async (desktopId, options) => {
    if (options?.requireSnapshot === true) {
      throw new AgentFailure('snapshot_failed', 'its memory snapshot failed, so it was not stopped: it runs on here with its programs (the agent log says why)', false);
    }
    return hibernate(desktopId, options);
  };
  const op = await moveTo(id, target);
  expect(op.state).toBe('failed');
  expect(op.error).toMatchObject({ code: 'memory_not_kept', message: expect.stringContaining('it runs on at its source with its programs') });
  expect((await call('GET', `/v1/desktops/${id}`)).json).toMatchObject({ state: 'awake', host_id: source.hostId });
  expect(driver.desktops.get(id)?.running).toBe(true);
  expect(target.driver!.desktops.has(id)).toBe(false);
  // For its user nothing happened: the same open interval, no event.
  expect(await billing(id)).toEqual(before);
  // Its guest calls are served where it runs.
  expect((await call('POST', `/v1/desktops/${id}/exec`, { command: 'true' })).status).toBe(200);
});

it('says the memory moved only when the target restored it', async () => {
  const { id, source, target } = await awakeDesktop();
  const kept = await moveTo(id, target);
  expect(kept.state, JSON.stringify(kept.error)).toBe('succeeded');
  expect(kept.result.memory_snapshot).toBe(true);
  // Back to the source, which boots it cold this time (as a restore that fails does).
  const driver = source.driver!;
  const start = driver.start.bind(driver);
  driver.start = async (spec) => {
    await start(spec);
    return { restored: false };
  };
  const cold = await moveTo(id, source);
  expect(cold.state, JSON.stringify(cold.error)).toBe('succeeded');
  expect(cold.result.memory_snapshot).toBe(false);
  expect((await call('GET', `/v1/desktops/${id}`)).json).toMatchObject({ state: 'awake', host_id: source.hostId });
});
