/**
 * wake, hibernate and destroy end to end through the API (docs/api.md §3, 4.1, 4.11, 6, 4.9): a real
 * scheduler with a real in-process agent on the FakeDriver. Operations, generation fencing,
 * `?wait=true` (settled, capped and failed), idempotent repeats, the outbox, the awake meter and
 * the idle timeout.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { api, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { expectProblem } from '../helpers/problem.js';

type Call = ReturnType<typeof api>;

let s: TestScheduler;
let agent: TestAgent;
let sql: Sql;
let call: Call;

beforeAll(async () => {
  s = await startTestScheduler();
  agent = await startFakeAgent(s.url);
  sql = connectDatabase(s.databaseUrl, { max: 2 });
  call = api(s.url, await mintKey(s.databaseUrl, 'lifecycle'));
});

afterAll(async () => {
  await agent?.stop();
  await sql?.end();
  await s?.close();
});

async function getDesktop(c: Call, id: string) {
  const res = await c('GET', `/v1/desktops/${id}`);
  expect(res.status).toBe(200);
  return res.json;
}

async function settled(c: Call, opId: string) {
  return until(async () => {
    const op = (await c('GET', `/v1/operations/${opId}`)).json;
    return op.state === 'succeeded' || op.state === 'failed' ? op : null;
  }, 15_000, `operation ${opId} to settle`);
}

/** Creates a desktop and waits until the engine has placed it (provisioning → hibernated). */
async function placedDesktop(body: Record<string, unknown> = {}): Promise<any> {
  const res = await call('POST', '/v1/desktops', { tier: 'small', ...body });
  expect(res.status).toBe(201);
  return until(async () => {
    const d = await getDesktop(call, res.json.id);
    return d.state === 'hibernated' ? d : null;
  }, 10_000, 'placement');
}

async function outbox(desktopId: string) {
  return sql<{ type: string; payload: any }[]>`SELECT type, payload FROM outbox WHERE desktop_id = ${desktopId} ORDER BY id`;
}

async function meter(desktopId: string) {
  return sql<{ started_at: Date; ended_at: Date | null }[]>`
    SELECT started_at, ended_at FROM meter_intervals WHERE desktop_id = ${desktopId} ORDER BY id`;
}

describe('a full life: create → wake → hibernate → wake → destroy', () => {
  let d: any;

  it('is placed on the agent host, generation 0 → 1, with a desktop.created event', async () => {
    const created = await call('POST', '/v1/desktops', { tier: 'small' });
    expect(created.json).toMatchObject({ state: 'provisioning', generation: 0, host_id: '' });
    d = await until(async () => {
      const x = await getDesktop(call, created.json.id);
      return x.state === 'hibernated' ? x : null;
    });
    expect(d.generation).toBe(1);
    expect(d.host_id).toBe(agent.hostId);
    expect(d.current_generation_id).not.toBe(created.json.current_generation_id);
  });

  it('wake without wait answers 202 with an open operation that then succeeds', async () => {
    const res = await call('POST', `/v1/desktops/${d.id}/wake`);
    expect(res.status, res.text).toBe(202);
    expect(res.json).toMatchObject({ desktop_id: d.id, kind: 'wake', result: null, error: null });
    expect(['pending', 'running']).toContain(res.json.state);
    const op = await settled(call, res.json.id);
    expect(op).toMatchObject({ state: 'succeeded', error: null });
    const awake = await getDesktop(call, d.id);
    // hibernated → waking → awake: two transitions, two generation bumps.
    expect(awake).toMatchObject({ state: 'awake', generation: d.generation + 2, host_id: agent.hostId });
    expect(awake.current_generation_id).not.toBe(d.current_generation_id);
    expect((await meter(d.id)).map((m) => m.ended_at)).toEqual([null]);
    d = awake;
  });

  it('hibernate?wait=true answers 200 with the settled operation and closes the meter', async () => {
    const res = await call('POST', `/v1/desktops/${d.id}/hibernate?wait=true`, {});
    expect(res.status, res.text).toBe(200);
    expect(res.json).toMatchObject({ desktop_id: d.id, kind: 'hibernate', state: 'succeeded', error: null });
    const after = await getDesktop(call, d.id);
    expect(after).toMatchObject({ state: 'hibernated', generation: d.generation + 2 });
    const intervals = await meter(d.id);
    expect(intervals).toHaveLength(1);
    expect(intervals[0]!.ended_at).toBeInstanceOf(Date);
    d = after;
  });

  it('GET /v1/usage shows awake seconds for the desktop', async () => {
    const res = await call('GET', '/v1/usage');
    expect(res.status).toBe(200);
    const line = res.json.per_desktop.find((l: { desktop_id: string }) => l.desktop_id === d.id);
    expect(line.awake_seconds).toBeGreaterThan(0);
    expect(line.weighted_awake_seconds).toBeCloseTo(line.awake_seconds * 0.5, 6);
  });

  it('wake?wait=true answers 200 succeeded; destroy?wait=true closes the open meter', async () => {
    const wake = await call('POST', `/v1/desktops/${d.id}/wake?wait=true`);
    expect(wake.status, wake.text).toBe(200);
    expect(wake.json).toMatchObject({ kind: 'wake', state: 'succeeded' });
    expect(await meter(d.id)).toHaveLength(2);
    const woken = await getDesktop(call, d.id);
    expect(woken).toMatchObject({ state: 'awake', generation: d.generation + 2 });

    const destroy = await call('POST', `/v1/desktops/${d.id}/destroy?wait=false`, {});
    expect(destroy.status, destroy.text).toBe(202);
    const op = await settled(call, destroy.json.id);
    expect(op).toMatchObject({ kind: 'destroy', state: 'succeeded' });
    const gone = await getDesktop(call, d.id);
    expect(gone).toMatchObject({ state: 'destroyed', generation: woken.generation + 1 });
    expect((await meter(d.id)).every((m) => m.ended_at !== null)).toBe(true);
    d = gone;
  });

  it('wrote one outbox event per transition with type and desktopId', async () => {
    const events = await outbox(d.id);
    expect(events.map((e) => e.type)).toEqual([
      'desktop.created', 'desktop.woken', 'desktop.hibernated', 'desktop.woken', 'desktop.destroyed',
    ]);
    for (const e of events) expect(e.payload).toMatchObject({ type: e.type, desktopId: d.id });
    const hibernated = events.find((e) => e.type === 'desktop.hibernated')!;
    expect(typeof hibernated.payload.data.reason).toBe('string');
    expect(hibernated.payload.data.reason).not.toBe('idle_timeout');
  });

  it('a destroyed desktop refuses every transition with 409', async () => {
    for (const kind of ['wake', 'hibernate', 'destroy']) {
      expectProblem(await call('POST', `/v1/desktops/${d.id}/${kind}`), 409, kind);
      expectProblem(await call('POST', `/v1/desktops/${d.id}/${kind}?wait=true`), 409, `${kind} wait`);
    }
    expect(await getDesktop(call, d.id)).toEqual(d);
  });
});

describe('wrong-state transitions and generation fencing', () => {
  it('hibernating a hibernated desktop and waking an awake one are 409', async () => {
    const d = await placedDesktop();
    expectProblem(await call('POST', `/v1/desktops/${d.id}/hibernate`), 409);
    expect((await call('POST', `/v1/desktops/${d.id}/wake?wait=true`)).status).toBe(200);
    const woken = await getDesktop(call, d.id);
    expectProblem(await call('POST', `/v1/desktops/${d.id}/wake`), 409);
    expectProblem(await call('POST', `/v1/desktops/${d.id}/wake?wait=true`), 409);
    expect(await getDesktop(call, d.id)).toEqual(woken);
  });

  it('a transition asked for while another operation runs is 409 naming that operation', async () => {
    const d = await placedDesktop();
    // An operation at work on the desktop (as a move or a fork is for seconds), out of the engine's reach.
    const [open] = await sql<Array<{ id: string }>>`
      INSERT INTO operations (id, org_id, desktop_id, kind, state, from_state, reason)
      VALUES (${`op_${'0'.repeat(20)}${d.id.slice(-4)}`}, ${d.org_id}, ${d.id}, 'move', 'running', 'hibernated', 'admin') RETURNING id`;
    try {
      for (const [path, body] of [['wake', undefined], ['fork', { count: 1, acknowledge_shared_state: true }], ['destroy', undefined]] as const) {
        const res = await call('POST', `/v1/desktops/${d.id}/${path}`, body);
        expectProblem(res, 409);
        expect(res.json.detail, path).toBe(`cannot ${path} the desktop while its move (operation ${open!.id}) is in progress; retry once it settles`);
        expect(res.json.operation_id).toBe(open!.id);
      }
      // A state that does not take the transition is still said first.
      expect((await call('POST', `/v1/desktops/${d.id}/hibernate`)).json.detail).toBe('cannot hibernate a desktop in state hibernated');
    } finally {
      await sql`DELETE FROM operations WHERE id = ${open!.id}`;
    }
    expect((await call('POST', `/v1/desktops/${d.id}/wake?wait=true`)).status).toBe(200);
  });

  it('a stale expected_generation is 409 with operation_id; the operation is failed; nothing moves', async () => {
    const d = await placedDesktop();
    // Any integer that differs is stale, one no desktop can be at as well (the contract: "given and differs").
    for (const [wait, expected] of [['', d.generation + 7], ['?wait=true', d.generation + 7], ['?wait=true', -1]] as const) {
      const res = await call('POST', `/v1/desktops/${d.id}/wake${wait}`, { expected_generation: expected });
      expectProblem(res, 409, `stale${wait}`);
      expect(res.json.operation_id).toMatch(/^op_/);
      const op = await call('GET', `/v1/operations/${res.json.operation_id}`);
      expect(op.status).toBe(200);
      expect(op.json).toMatchObject({ id: res.json.operation_id, desktop_id: d.id, kind: 'wake', state: 'failed' });
      expect(op.json.error).toMatchObject({ code: 'generation_mismatch', current_generation: d.generation });
    }
    expect(await getDesktop(call, d.id)).toEqual(d);
  });

  it('a matching expected_generation is accepted', async () => {
    const d = await placedDesktop();
    const res = await call('POST', `/v1/desktops/${d.id}/wake?wait=true`, { expected_generation: d.generation });
    expect(res.status, res.text).toBe(200);
    expect(res.json.state).toBe('succeeded');
    const awake = await getDesktop(call, d.id);
    const hib = await call('POST', `/v1/desktops/${d.id}/hibernate`, { expected_generation: awake.generation });
    expect(hib.status, hib.text).toBe(202);
    expect((await settled(call, hib.json.id)).state).toBe('succeeded');
  });
});

describe('Idempotency-Key on wake (docs/api.md §4.11)', () => {
  it('a repeat returns the same operation and enqueues nothing, even after the desktop moved on', async () => {
    const d = await placedDesktop();
    const first = await call('POST', `/v1/desktops/${d.id}/wake`, {}, { 'idempotency-key': 'wake-1' });
    expect(first.status).toBe(202);
    const again = await call('POST', `/v1/desktops/${d.id}/wake`, {}, { 'idempotency-key': 'wake-1' });
    expect([200, 202]).toContain(again.status);
    expect(again.json.id).toBe(first.json.id);
    await settled(call, first.json.id);
    // Awake now: a fresh wake would be 409, the repeat still returns the original operation.
    const late = await call('POST', `/v1/desktops/${d.id}/wake?wait=true`, {}, { 'idempotency-key': 'wake-1' });
    expect(late.status, late.text).toBe(200);
    expect(late.json).toMatchObject({ id: first.json.id, state: 'succeeded' });
    const ops = await sql`SELECT id FROM operations WHERE desktop_id = ${d.id}`;
    expect(ops.map((o) => o.id)).toEqual([first.json.id]);
  });

  it('five concurrent wakes with one key share one operation', async () => {
    const d = await placedDesktop();
    const results = await Promise.all(
      Array.from({ length: 5 }, () => call('POST', `/v1/desktops/${d.id}/wake`, {}, { 'idempotency-key': 'wake-race' })),
    );
    expect(results.every((r) => r.status === 200 || r.status === 202), results.map((r) => r.text).join('\n')).toBe(true);
    expect(new Set(results.map((r) => r.json.id)).size).toBe(1);
    expect(await sql`SELECT 1 FROM operations WHERE desktop_id = ${d.id}`).toHaveLength(1);
    expect((await settled(call, results[0]!.json.id)).state).toBe('succeeded');
  });

  it('the same key on another desktop is independent', async () => {
    const [a, b] = await Promise.all([placedDesktop(), placedDesktop()]);
    const opA = await call('POST', `/v1/desktops/${a.id}/wake`, {}, { 'idempotency-key': 'shared-key' });
    const opB = await call('POST', `/v1/desktops/${b.id}/wake`, {}, { 'idempotency-key': 'shared-key' });
    expect([opA.status, opB.status]).toEqual([202, 202]);
    expect(opA.json.id).not.toBe(opB.json.id);
    expect(opB.json.desktop_id).toBe(b.id);
    expect((await settled(call, opB.json.id)).state).toBe('succeeded');
  });
});

describe('idle timeout (docs/api.md §3.2)', () => {
  it('idle_timeout_secs=1 auto-hibernates after a wake; 0 never does', async () => {
    const [idle, never] = await Promise.all([placedDesktop({ idle_timeout_secs: 1 }), placedDesktop({ idle_timeout_secs: 0 })]);
    const wakes = await Promise.all([idle, never].map((d) => call('POST', `/v1/desktops/${d.id}/wake?wait=true`)));
    expect(wakes.map((w) => w.json.state)).toEqual(['succeeded', 'succeeded']);
    await until(async () => (await getDesktop(call, idle.id)).state === 'hibernated', 10_000, 'idle hibernate');

    const [op] = await sql<{ reason: string; state: string; created_at: Date }[]>`
      SELECT reason, state, created_at FROM operations WHERE desktop_id = ${idle.id} AND kind = 'hibernate'`;
    expect(op).toMatchObject({ reason: 'idle_timeout', state: 'succeeded' });
    const [row] = await sql<{ last_woken_at: Date }[]>`SELECT last_woken_at FROM desktops WHERE id = ${idle.id}`;
    // Counted from the last wake (DB clock on both sides).
    expect(op!.created_at.getTime() - row!.last_woken_at.getTime()).toBeGreaterThanOrEqual(1000);
    const event = (await outbox(idle.id)).find((e) => e.type === 'desktop.hibernated');
    expect(event?.payload.data.reason).toBe('idle_timeout');
    expect((await meter(idle.id)).every((m) => m.ended_at !== null)).toBe(true);

    // The 0 desktop has been awake at least as long and is still awake, with no hibernate queued.
    expect((await getDesktop(call, never.id)).state).toBe('awake');
    expect(await sql`SELECT 1 FROM operations WHERE desktop_id = ${never.id} AND kind = 'hibernate'`).toHaveLength(0);
  });
});

describe('?wait=true bounds', () => {
  let capped: TestScheduler;
  let slowAgent: TestAgent;
  let failing: TestScheduler;

  beforeAll(async () => {
    [capped, failing] = await Promise.all([
      startTestScheduler({ CANTO_WAIT_CAP_MS: '300' }),
      // No agent ever connects: the wake waits for a host with room until its 1 s deadline.
      startTestScheduler({ CANTO_HOST_WAIT_MS: '100', CANTO_OPERATION_DEADLINE_MS: '1000' }),
    ]);
    slowAgent = await startFakeAgent(capped.url, { delayMs: 1000 });
  });

  afterAll(async () => {
    await slowAgent?.stop();
    await Promise.all([capped?.close(), failing?.close()]);
  });

  it('the cap reached while the operation runs answers 200 with the in-progress operation', async () => {
    const c = api(capped.url, await mintKey(capped.databaseUrl, 'capped'));
    const id = (await c('POST', '/v1/desktops', { tier: 'small' })).json.id;
    const started = Date.now();
    const res = await c('POST', `/v1/desktops/${id}/wake?wait=true`);
    const elapsed = Date.now() - started;
    expect(res.status, res.text).toBe(200);
    expect(res.json).toMatchObject({ desktop_id: id, kind: 'wake', error: null, settled_at: null });
    expect(['pending', 'running']).toContain(res.json.state);
    expect(elapsed).toBeGreaterThanOrEqual(250);
    expect(elapsed).toBeLessThan(1_500);
    // Observed mid-flight: provisioning (0) → waking (1), not yet placed on the slow host.
    expect(await getDesktop(c, id)).toMatchObject({ state: 'waking', generation: 1 });
    // It does finish, once the slow host is done: waking → awake (2), placed on the way.
    expect((await settled(c, res.json.id)).state).toBe('succeeded');
    expect(await getDesktop(c, id)).toMatchObject({ state: 'awake', generation: 2, host_id: slowAgent.hostId });
  });

  it('a wake no host has room for fails with no_capacity once the capacity wait is over, saying why', async () => {
    const full = await startTestScheduler({ CANTO_HOST_SLOTS: '1', CANTO_CAPACITY_WAIT_MS: '500' });
    const agent = await startFakeAgent(full.url);
    try {
      const c = api(full.url, await mintKey(full.databaseUrl, 'full'));
      const first = (await c('POST', '/v1/desktops', { tier: 'small' })).json.id;
      expect((await c('POST', `/v1/desktops/${first}/wake?wait=true`)).json.state).toBe('succeeded');
      const second = (await c('POST', '/v1/desktops', { tier: 'small' })).json.id;
      const res = await c('POST', `/v1/desktops/${second}/wake?wait=true`);
      expectProblem(res, 409);
      const op = await c('GET', `/v1/operations/${res.json.operation_id}`);
      expect(op.json.error).toEqual({
        code: 'no_capacity',
        message: 'no host has room for a small desktop: 1 schedulable, 1 out of storage slots',
      });
      expect((await getDesktop(c, second)).state).toBe('provisioning');
    } finally {
      await agent.stop();
      await full.close();
    }
  });

  it('a failed operation seen through wait is 409 with operation_id', async () => {
    const c = api(failing.url, await mintKey(failing.databaseUrl, 'failing'));
    const id = (await c('POST', '/v1/desktops', { tier: 'small' })).json.id;
    const res = await c('POST', `/v1/desktops/${id}/wake?wait=true`);
    expectProblem(res, 409);
    expect(res.json.operation_id).toMatch(/^op_/);
    const op = await c('GET', `/v1/operations/${res.json.operation_id}`);
    expect(op.json).toMatchObject({ desktop_id: id, kind: 'wake', state: 'failed' });
    expect(op.json.error).toEqual({ code: 'no_capacity', message: 'no host is up to take a small desktop' });
    // A failed wake leaves the desktop where it was, and it can be woken again.
    expect((await getDesktop(c, id)).state).toBe('provisioning');
    expect((await c('POST', `/v1/desktops/${id}/wake`)).status).toBe(202);
  });
});
