/**
 * What a failed wake, hibernate or destroy records when its host did the work after all (a
 * command that went through and a commit after it that failed, or a start that failed after the
 * guest booted): the record says what runs, and what is billed follows it. Also: an operation
 * settled by an earlier commit whose answer was lost is not driven again and again, and a
 * replica that does not lead claims and places nothing.
 * Real scheduler and database, fake agents over real websockets; database faults are injected
 * by a trigger, once.
 */
import { afterAll, beforeAll, beforeEach, expect, it } from 'vitest';
import { AgentFailure } from '../../shared/src/protocol.js';
import { api, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { connectDatabase, inTransaction, type Sql } from '../../scheduler/src/store/db.js';
import { claimPending } from '../../scheduler/src/store/operations.js';
import { setPlacement } from '../../scheduler/src/store/desktops.js';
import { clearDesktopsFault, failDesktopsOnce } from '../helpers/db-faults.js';

let s: TestScheduler;
let sql: Sql;
let call: ReturnType<typeof api>;
let agent: TestAgent;
let restoreDriver: () => void;

beforeAll(async () => {
  s = await startTestScheduler({ CANTO_OPERATION_DEADLINE_MS: '3000' });
  sql = connectDatabase(s.databaseUrl, { max: 2 });
  call = api(s.url, await mintKey(s.databaseUrl, 'step-failures'));
  agent = await startFakeAgent(s.url, { delayMs: 0 });
  const driver = agent.driver!;
  const { start, hibernate, destroy } = driver;
  restoreDriver = () => Object.assign(driver, { start, hibernate, destroy });
});

beforeEach(async () => {
  restoreDriver();
  await clearDesktopsFault(sql);
});

afterAll(async () => {
  if (sql) {
    await clearDesktopsFault(sql);
    await sql.end();
  }
  await agent?.stop();
  await s?.close();
});

async function awake(): Promise<string> {
  const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
  expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
  return id;
}

async function billing(id: string) {
  const meters = await sql<Array<{ ended_at: Date | null }>>`SELECT ended_at FROM meter_intervals WHERE desktop_id = ${id} ORDER BY started_at`;
  const events = await sql<Array<{ type: string }>>`SELECT type FROM outbox WHERE desktop_id = ${id} ORDER BY id`;
  return { open: meters.filter((m) => m.ended_at === null).length, events: events.map((e) => e.type) };
}

it('stops a desktop whose wake failed after its guest booted, and records it hibernated', async () => {
  const id = await awake();
  expect((await call('POST', `/v1/desktops/${id}/hibernate?wait=true`)).status).toBe(200);
  const driver = agent.driver!;
  const start = driver.start.bind(driver);
  driver.start = async (spec) => {
    await start(spec);
    throw new AgentFailure('runtime_error', 'the env file could not be written', false);
  };
  expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(409);
  expect((await call('GET', `/v1/desktops/${id}`)).json.state).toBe('hibernated');
  expect(driver.desktops.get(id)?.running).toBe(false);
  expect((await billing(id)).open).toBe(0);
}, 30_000);

it('records a hibernate whose commit failed as done when the host did stop the desktop', async () => {
  const id = await awake();
  await failDesktopsOnce(sql, '23514', 'UPDATE', "OLD.state = 'hibernating' AND NEW.state = 'hibernated'");
  const hibernated = await call('POST', `/v1/desktops/${id}/hibernate?wait=true`);
  expect(hibernated.status, hibernated.text).toBe(200);
  expect(hibernated.json.state).toBe('succeeded');
  expect((await call('GET', `/v1/desktops/${id}`)).json.state).toBe('hibernated');
  expect(agent.driver!.desktops.get(id)?.running).toBe(false);
  // Billed until the stop, and told once.
  const after = await billing(id);
  expect(after.open).toBe(0);
  expect(after.events.filter((e) => e === 'desktop.hibernated')).toHaveLength(1);
  // And it wakes as any hibernated desktop does.
  expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
}, 30_000);

it('still records a hibernate whose dump failed as awake, the desktop running', async () => {
  const id = await awake();
  agent.driver!.hibernate = async () => {
    throw new AgentFailure('runtime_error', 'the dump failed', false);
  };
  expect((await call('POST', `/v1/desktops/${id}/hibernate?wait=true`)).status).toBe(409);
  expect((await call('GET', `/v1/desktops/${id}`)).json.state).toBe('awake');
  expect(agent.driver!.desktops.get(id)?.running).toBe(true);
  expect((await billing(id)).open).toBe(1);
}, 30_000);

it('records a destroy whose commit failed as done once the host destroys it again', async () => {
  const id = await awake();
  await failDesktopsOnce(sql, '23514', 'UPDATE', "NEW.state = 'destroyed'");
  const destroyed = await call('POST', `/v1/desktops/${id}/destroy?wait=true`);
  expect(destroyed.status, destroyed.text).toBe(200);
  expect(destroyed.json.state).toBe('succeeded');
  expect((await call('GET', `/v1/desktops/${id}`)).json.state).toBe('destroyed');
  expect(agent.driver!.desktops.has(id)).toBe(false);
  const after = await billing(id);
  expect(after.open).toBe(0);
  expect(after.events.filter((e) => e === 'desktop.destroyed')).toHaveLength(1);
}, 30_000);

it('lets go of an operation that an earlier commit settled unheard, and drives the next one', async () => {
  const id = await awake();
  expect((await call('POST', `/v1/desktops/${id}/hibernate?wait=true`)).status).toBe(200);
  const driver = agent.driver!;
  const start = driver.start.bind(driver);
  let starts = 0;
  let release!: () => void;
  const gate = new Promise<void>((resolve) => (release = resolve));
  driver.start = async (spec) => {
    starts += 1;
    await gate;
    return start(spec);
  };
  const wake = (await call('POST', `/v1/desktops/${id}/wake`)).json.id as string;
  await until(() => starts === 1, 10_000, 'the start to be sent');
  // What an earlier attempt's commit would have left, had its answer been lost on the way.
  await sql`UPDATE desktops SET state = 'awake', generation = generation + 1 WHERE id = ${id}`;
  await sql`UPDATE operations SET state = 'succeeded', settled_at = now() WHERE id = ${wake}`;
  release();
  const hibernate = await call('POST', `/v1/desktops/${id}/hibernate?wait=true`);
  expect(hibernate.status, hibernate.text).toBe(200);
  expect(hibernate.json.state).toBe('succeeded');
  expect((await call('GET', `/v1/operations/${wake}`)).json.state).toBe('succeeded');
  // The settled wake was not driven again and again meanwhile.
  expect(starts).toBeLessThanOrEqual(2);
}, 30_000);

it('claims nothing for a term that does not hold the lease, and places no desktop that is not waiting for a place', async () => {
  const id = await awake();
  const [d] = await sql<Array<{ org_id: string; host_id: string }>>`SELECT org_id, host_id FROM desktops WHERE id = ${id}`;
  await inTransaction(sql, async (tx) => {
    await tx`INSERT INTO operations (id, org_id, desktop_id, kind, state, from_state) VALUES ('op_claimtest', ${d!.org_id}, ${id}, 'hibernate', 'pending', 'awake')`;
    expect(await claimPending(tx, 20, { holder: 'not-the-leader', epoch: 0 })).toEqual([]);
    const term = s.leadership.term()!;
    expect((await claimPending(tx, 20, { holder: term.holder, epoch: term.epoch })).map((o) => o.id)).toContain('op_claimtest');
    await tx`SELECT 1 FROM pg_sleep(0)`;
    throw new Error('roll back');
  }).catch((err: unknown) => expect((err as Error).message).toBe('roll back'));

  expect((await call('POST', `/v1/desktops/${id}/destroy?wait=true`)).status).toBe(200);
  await sql`UPDATE desktops SET host_id = NULL WHERE id = ${id}`;
  expect(await setPlacement(sql, id, d!.host_id)).toBe(false);
}, 30_000);

it('asks an idle desktop whose hibernate keeps failing again only after a pause, not at every sweep', async () => {
  const id = await awake();
  agent.driver!.hibernate = async () => {
    throw new AgentFailure('runtime_error', 'the dump failed', false);
  };
  expect((await call('PATCH', `/v1/desktops/${id}`, { idle_timeout_secs: 1 })).status).toBe(200);
  await until(async () => (await sql`SELECT 1 FROM operations WHERE desktop_id = ${id} AND reason = 'idle_timeout' AND state = 'failed'`).length === 1, 10_000, 'the idle hibernate to fail');
  // Five sweeps and more (every 200 ms here): still the one.
  await new Promise((resolve) => setTimeout(resolve, 1_500));
  const ops = await sql`SELECT state FROM operations WHERE desktop_id = ${id} AND reason = 'idle_timeout'`;
  expect(ops.map((o) => o.state)).toEqual(['failed']);
  expect((await call('GET', `/v1/desktops/${id}`)).json.state).toBe('awake');
}, 30_000);
