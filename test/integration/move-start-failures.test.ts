/**
 * A move whose desktop is already committed to the target when something goes wrong there:
 * - a start that keeps failing retryably ends the move failed with the desktop recorded
 *   hibernated on the target (its disk and memory are there), billed to the move's stop, one
 *   `desktop.hibernated` sent, and a wake that works; a start that did go through although it
 *   answered a failure is stopped again rather than left running under that record;
 * - the start's retries are counted from the commit, not from the move's start, so a long copy
 *   does not leave the start without a retry;
 * - a leader that cannot tell it still leads at the start writes nothing: the move is finished
 *   by the same term (or the next leader), the desktop awake and billed throughout;
 * - a commit whose COMMIT failed on a passing fault is not taken for done;
 * - a plain wake that failed on a start which went through after all is stopped again too.
 * Real scheduler and database, fake agents over real websockets.
 */
import { afterAll, beforeAll, beforeEach, expect, it } from 'vitest';
import { AgentFailure } from '../../shared/src/protocol.js';
import type { FakeDriver } from '../../agent/src/runtime/fake.js';
import { adminApi, api, mintKey, moveSettled, startTestScheduler, TEST_ADMIN_TOKEN, until, type TestScheduler } from '../helpers/scheduler.js';
import { awakeOnOneOf, startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';

/** Short, so a start failing to the deadline ends within the test; copies are slowed past it. */
const DEADLINE_MS = 3_000;

let s: TestScheduler;
let sql: Sql;
let call: ReturnType<typeof api>;
let admin: ReturnType<typeof api>;
const agents: TestAgent[] = [];
/** The drivers' own methods, put back before each test. */
const originals: Array<() => void> = [];

beforeAll(async () => {
  s = await startTestScheduler({ CANTO_ADMIN_TOKEN: TEST_ADMIN_TOKEN, CANTO_HEARTBEAT_MS: '200', CANTO_OPERATION_DEADLINE_MS: String(DEADLINE_MS) });
  sql = connectDatabase(s.databaseUrl, { max: 2 });
  call = api(s.url, await mintKey(s.databaseUrl, 'move-starts'));
  admin = adminApi(s.url);
  for (let i = 0; i < 2; i++) {
    const agent = await startFakeAgent(s.url, { delayMs: 0 });
    agents.push(agent);
    const driver = agent.driver!;
    const { start, hibernate } = driver;
    const { install } = driver.transfer;
    originals.push(() => {
      driver.start = start;
      driver.hibernate = hibernate;
      driver.transfer.install = install;
    });
  }
});

beforeEach(async () => {
  for (const restore of originals) restore();
  await sql`DROP TRIGGER IF EXISTS fail_commit_once ON operations`;
});

afterAll(async () => {
  if (sql) {
    await sql`DROP TRIGGER IF EXISTS fail_commit_once ON operations`;
    await sql.end();
  }
  for (const agent of agents) await agent.stop();
  await s?.close();
});


const awakeDesktop = () => awakeOnOneOf(call, agents);
const moveTo = (id: string, target: TestAgent): Promise<any> => moveSettled(admin, id, target.hostId);

/** The desktop's billing and lifecycle events as its org would see them. */
async function billing(id: string) {
  const meters = await sql<Array<{ started_at: Date; ended_at: Date | null }>>`
    SELECT started_at, ended_at FROM meter_intervals WHERE desktop_id = ${id} ORDER BY started_at`;
  const events = await sql<Array<{ type: string; data: Record<string, unknown> }>>`
    SELECT type, payload->'data' AS data FROM outbox WHERE desktop_id = ${id} ORDER BY id`;
  return { meters: [...meters], events: events.map((e) => ({ type: e.type, data: e.data })) };
}

async function moveParams(operationId: string): Promise<Record<string, any>> {
  const [row] = await sql<Array<{ params: Record<string, any> }>>`SELECT params FROM operations WHERE id = ${operationId}`;
  return row!.params;
}

function failStarts(driver: FakeDriver, times: number, then: 'start' | 'fail' = 'start'): void {
  const start = driver.start.bind(driver);
  let failed = 0;
  driver.start = async (spec) => {
    if (failed < times) {
      failed += 1;
      throw new AgentFailure('runtime_error', 'the desktop did not boot', true);
    }
    if (then === 'fail') throw new AgentFailure('runtime_error', 'the desktop did not boot', true);
    return start(spec);
  };
}

it('records a desktop whose start on the target keeps failing hibernated there, billed to the stop, and it wakes again', async () => {
  const { id, target } = await awakeDesktop();
  const before = await billing(id);
  failStarts(target.driver!, Infinity, 'fail');
  const op = await moveTo(id, target);
  expect(op.state).toBe('failed');
  expect((await call('GET', `/v1/desktops/${id}`)).json).toMatchObject({ state: 'hibernated', host_id: target.hostId });
  const after = await billing(id);
  const stoppedAt = Date.parse((await moveParams(op.id)).stopped_at);
  // The interval the user woke it in ends when the move stopped it; nothing runs after.
  expect(after.meters).toHaveLength(before.meters.length);
  expect(after.meters.at(-1)!.ended_at?.getTime()).toBe(stoppedAt);
  const hibernated = after.events.filter((e) => e.type === 'desktop.hibernated');
  expect(hibernated).toEqual([{ type: 'desktop.hibernated', data: expect.objectContaining({ reason: 'move', cause: 'start_failed', host_id: target.hostId }) }]);

  for (const restore of originals) restore();
  const woke = await call('POST', `/v1/desktops/${id}/wake?wait=true`);
  expect(woke.status, woke.text).toBe(200);
  expect((await call('GET', `/v1/desktops/${id}`)).json).toMatchObject({ state: 'awake', host_id: target.hostId });
}, 60_000);

it('stops a desktop whose start went through on the target although it answered a failure', async () => {
  const { id, target } = await awakeDesktop();
  const driver = target.driver!;
  const start = driver.start.bind(driver);
  driver.start = async (spec) => {
    await start(spec);
    throw new AgentFailure('timeout', 'desktop.start timed out', true);
  };
  const op = await moveTo(id, target);
  expect(op.state).toBe('failed');
  expect((await call('GET', `/v1/desktops/${id}`)).json.state).toBe('hibernated');
  // Recorded hibernated, so it must not run there unbilled.
  expect(driver.desktops.get(id)?.running).toBe(false);
}, 60_000);

it('gives the start on the target its retries however long the copy took', async () => {
  const { id, target } = await awakeDesktop();
  const transfer = target.driver!.transfer;
  const install = transfer.install.bind(transfer);
  transfer.install = async (desktopId, spec) => {
    // The copy alone outlasts the operation deadline.
    await new Promise((resolve) => setTimeout(resolve, DEADLINE_MS + 300));
    return install(desktopId, spec);
  };
  failStarts(target.driver!, 1);
  const op = await moveTo(id, target);
  expect(op.state, JSON.stringify(op.error)).toBe('succeeded');
  expect((await call('GET', `/v1/desktops/${id}`)).json).toMatchObject({ state: 'awake', host_id: target.hostId });
}, 60_000);

it('writes nothing when the leader cannot tell it leads at the start, and finishes the move once it can', async () => {
  const { id, target } = await awakeDesktop();
  const before = await billing(id);
  const transfer = target.driver!.transfer;
  const install = transfer.install.bind(transfer);
  const term = s.leadership.term.bind(s.leadership);
  transfer.install = async (desktopId, spec) => {
    const installed = await install(desktopId, spec);
    // The import is done and the commit follows: for 600 ms from here this replica cannot tell
    // that it still leads, which is when it would send the start.
    s.leadership.term = () => null;
    setTimeout(() => (s.leadership.term = term), 600);
    return installed;
  };
  const op = await moveTo(id, target);
  expect(op.state, JSON.stringify(op.error)).toBe('succeeded');
  expect((await call('GET', `/v1/desktops/${id}`)).json).toMatchObject({ state: 'awake', host_id: target.hostId });
  expect(target.driver!.desktops.get(id)?.running).toBe(true);
  // Billed throughout, and nothing told the org it stopped.
  expect(await billing(id)).toEqual(before);
}, 60_000);

it('does not take a commit whose COMMIT failed for done', async () => {
  const { id, target } = await awakeDesktop();
  // The commit's transaction fails at COMMIT once, with a fault the server means to be passing.
  await sql.unsafe(`
    DROP SEQUENCE IF EXISTS fail_commit_seq;
    CREATE SEQUENCE fail_commit_seq;
    CREATE OR REPLACE FUNCTION fail_commit_once() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF nextval('fail_commit_seq') = 1 THEN
        RAISE EXCEPTION 'injected commit fault' USING ERRCODE = '40001';
      END IF;
      RETURN NEW;
    END $$;
    CREATE CONSTRAINT TRIGGER fail_commit_once AFTER UPDATE ON operations DEFERRABLE INITIALLY DEFERRED
      FOR EACH ROW WHEN (NEW.kind = 'move' AND NEW.params->>'phase' = 'committed' AND OLD.params->>'phase' IS DISTINCT FROM 'committed')
      EXECUTE FUNCTION fail_commit_once();`);
  const op = await moveTo(id, target);
  expect(op.state, JSON.stringify(op.error)).toBe('succeeded');
  expect((await sql`SELECT nextval('fail_commit_seq') AS n`)[0]!.n).not.toBe('1');
  expect((await call('GET', `/v1/desktops/${id}`)).json).toMatchObject({ state: 'awake', host_id: target.hostId });
  // Not left marked as moving: guest calls are served.
  const [row] = await sql<Array<{ moving_operation_id: string | null }>>`SELECT moving_operation_id FROM desktops WHERE id = ${id}`;
  expect(row!.moving_operation_id).toBeNull();
  const wrote = await call('PUT', `/v1/desktops/${id}/files/root/after-move.txt`, 'here', { 'content-type': 'application/octet-stream' });
  expect(wrote.status, wrote.text).toBe(204);
}, 60_000);

it('stops a drain whose move failed only in the start, saying where the desktop is now', async () => {
  const { id, source, target } = await awakeDesktop();
  failStarts(target.driver!, Infinity, 'fail');
  expect((await admin('POST', `/admin/v1/hosts/${source.hostId}/drain`, { parallel: 1 })).status).toBe(202);
  const drain = await until(async () => {
    const d = (await admin('GET', `/admin/v1/hosts/${source.hostId}`)).json.drain;
    return d?.state === 'stopped' ? d : null;
  }, 30_000, 'the drain to stop');
  expect(drain.error).toBe(
    `desktop ${id} moved to ${target.hostId} but could not be started there (recorded hibernated; a wake retries): the desktop runtime failed; the host agent log has the details`,
  );
  expect((await call('GET', `/v1/desktops/${id}`)).json).toMatchObject({ state: 'hibernated', host_id: target.hostId });
  await admin('POST', `/admin/v1/hosts/${source.hostId}/uncordon`);
}, 60_000);

it('stops a desktop whose wake failed on a timeout although its start went through', async () => {
  const { id, source } = await awakeDesktop();
  expect((await call('POST', `/v1/desktops/${id}/hibernate?wait=true`)).status).toBe(200);
  const driver = source.driver!;
  const start = driver.start.bind(driver);
  driver.start = async (spec) => {
    await start(spec);
    throw new AgentFailure('timeout', 'desktop.start timed out', true);
  };
  const woke = await call('POST', `/v1/desktops/${id}/wake?wait=true`);
  expect(woke.status, woke.text).toBe(409);
  expect((await call('GET', `/v1/operations/${woke.json.operation_id}`)).json).toMatchObject({ state: 'failed', error: { code: 'timeout' } });
  expect((await call('GET', `/v1/desktops/${id}`)).json.state).toBe('hibernated');
  expect(driver.desktops.get(id)?.running).toBe(false);
}, 60_000);

it('answers guest calls 503 with Retry-After, never 409, while the desktop is between hosts', async () => {
  const { id, target } = await awakeDesktop();
  const driver = target.driver!;
  const start = driver.start.bind(driver);
  driver.start = async (spec) => {
    // Committed on the target, not yet running there: the window a call finds it nowhere.
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    return start(spec);
  };
  const statuses = new Map<number, number>();
  let moving = true;
  const calls = (async () => {
    while (moving) {
      const res = await call('POST', `/v1/desktops/${id}/exec`, { command: 'true' });
      statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1);
      if (res.status === 503) expect(res.headers.get('retry-after')).not.toBeNull();
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  })();
  const op = await moveTo(id, target);
  moving = false;
  await calls;
  expect(op.state, JSON.stringify(op.error)).toBe('succeeded');
  expect([...statuses.keys()].sort()).toEqual([200, 503]);
}, 60_000);

it('sweeps the copy a rolled-back move left on a target that was away, whose fence is ahead of the record', async () => {
  const { id, source, target } = await awakeDesktop();
  const transfer = target.driver!.transfer;
  const install = transfer.install.bind(transfer);
  const { stateDir, driver } = target;
  // The target installs the copy and goes away before it answers: the move cannot commit, and
  // the target is not there to drop its copy when the move rolls back.
  let stopped: Promise<void> = Promise.resolve();
  let release!: () => void;
  const held = new Promise<void>((resolve) => (release = resolve));
  transfer.install = async (desktopId, spec) => {
    await install(desktopId, spec);
    stopped = target.stop(true);
    // Never answered on the link that went; let go of once the test is done with it.
    await held;
    throw new Error('the agent went');
  };
  const op = await moveTo(id, target);
  expect(op.state).toBe('failed');
  expect((await call('GET', `/v1/desktops/${id}`)).json).toMatchObject({ state: 'awake', host_id: source.hostId });
  // Back, it still holds that copy, fenced at the generation the commit would have given.
  const back = await startFakeAgent(s.url, { again: { stateDir, driver: driver! } });
  agents[agents.indexOf(target)] = back;
  await until(() => !back.driver!.desktops.has(id), 15_000, 'the rolled-back copy to be swept');
  expect(source.driver!.desktops.get(id)?.running).toBe(true);
  release();
  await stopped;
}, 60_000);

it('bills a desktop whose source went silent before the move stopped it until that host was last heard from', async () => {
  const { id, source, target } = await awakeDesktop();
  const { stateDir, driver } = source;
  let stopped: Promise<void> = Promise.resolve();
  let release!: () => void;
  const held = new Promise<void>((resolve) => (release = resolve));
  // The source goes away as the move asks it to stop the desktop: the stop never happens.
  driver!.hibernate = async () => {
    stopped = source.stop(true);
    await held;
    throw new Error('the agent went');
  };
  const op = await moveTo(id, target);
  expect(op.state).toBe('failed');
  expect((await call('GET', `/v1/desktops/${id}`)).json).toMatchObject({ state: 'hibernated', host_id: source.hostId });
  const [host] = await sql<Array<{ last_seen_at: Date; status: string }>>`SELECT last_seen_at, status FROM hosts WHERE id = ${source.hostId}`;
  expect(host!.status).toBe('down');
  const last = (await billing(id)).meters.at(-1)!;
  // Not until the move gave up, its deadline later: until the host was last heard from (or the
  // wake, should that have come after the last heartbeat the host's row recorded).
  expect(last.ended_at?.getTime()).toBe(Math.max(last.started_at.getTime(), host!.last_seen_at.getTime()));
  expect(last.ended_at!.getTime()).toBeLessThan(Date.parse(op.settled_at) - DEADLINE_MS / 2);
  release();
  await stopped;
  agents[agents.indexOf(source)] = await startFakeAgent(s.url, { again: { stateDir, driver: driver! } });
}, 60_000);
