/**
 * Fork through the API (docs/api.md §4.1 fork rules, 2.5, 3.2) with a real scheduler and a real agent on
 * the FakeDriver: validation, the state rule, `?wait=true`, inheritance, independence of the
 * copies, ephemeral forks destroyed at their idle timeout, and the storage-slot capacity model
 * (413). The same flow against the real sandbox runtime is in test/e2e/fork.test.ts.
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
let key: string;

beforeAll(async () => {
  // 8 storage slots per host: a small desktop holds 1, a large one 4.
  s = await startTestScheduler({ CANTO_HOST_SLOTS: '8' });
  agent = await startFakeAgent(s.url, { delayMs: 0 });
  sql = connectDatabase(s.databaseUrl, { max: 2 });
  key = await mintKey(s.databaseUrl, 'forks');
  call = api(s.url, key);
});

afterAll(async () => {
  await agent?.stop();
  await sql?.end();
  await s?.close();
});

async function hibernatedDesktop(body: Record<string, unknown> = {}): Promise<any> {
  const created = await call('POST', '/v1/desktops', { tier: 'small', ...body });
  expect(created.status).toBe(201);
  expect((await call('POST', `/v1/desktops/${created.json.id}/wake?wait=true`)).json.state).toBe('succeeded');
  expect((await call('POST', `/v1/desktops/${created.json.id}/hibernate?wait=true`)).json.state).toBe('succeeded');
  return (await call('GET', `/v1/desktops/${created.json.id}`)).json;
}

async function destroyAll(ids: string[]): Promise<void> {
  for (const id of ids) await call('POST', `/v1/desktops/${id}/destroy?wait=true`);
}

const fork = (id: string, body: unknown, query = '?wait=true') => call('POST', `/v1/desktops/${id}/fork${query}`, body);

describe('POST /v1/desktops/{id}/fork', () => {
  it('validates count (1..=20), acknowledge_shared_state (must be true) and ephemeral', async () => {
    const src = await hibernatedDesktop();
    for (const body of [
      { count: 0, acknowledge_shared_state: true },
      { count: 21, acknowledge_shared_state: true },
      { count: 1.5, acknowledge_shared_state: true },
      { acknowledge_shared_state: true },
      { count: 1 },
      { count: 1, acknowledge_shared_state: false },
      { count: 1, acknowledge_shared_state: true, ephemeral: 'yes' },
    ]) {
      expectProblem(await fork(src.id, body), 400, JSON.stringify(body));
    }
    expectProblem(await fork(src.id, { count: 1, acknowledge_shared_state: true }, '?wait=maybe'), 400, 'wait');
    await destroyAll([src.id]);
  });

  it('answers 404 for a missing or foreign source and 409 unless it is hibernated', async () => {
    const src = await hibernatedDesktop();
    const other = api(s.url, await mintKey(s.databaseUrl, 'not-forks'));
    const foreign = await other('POST', `/v1/desktops/${src.id}/fork`, { count: 1, acknowledge_shared_state: true });
    expectProblem(foreign, 404);
    expect((await call('POST', `/v1/desktops/${src.id}/wake?wait=true`)).status).toBe(200);
    expectProblem(await fork(src.id, { count: 1, acknowledge_shared_state: true }), 409, 'awake source');
    const fresh = await call('POST', '/v1/desktops', { tier: 'small' });
    const provisioning = await fork(fresh.json.id, { count: 1, acknowledge_shared_state: true });
    expect([409]).toContain(provisioning.status);
    await destroyAll([src.id, fresh.json.id]);
  });

  it('creates independent hibernated copies that inherit the source, and leaves the source as it was', async () => {
    const src = await hibernatedDesktop({ idle_timeout_secs: 1234, billing_mode: 'monthly', image_version: 'debian-12' });
    const res = await fork(src.id, { count: 3, acknowledge_shared_state: true });
    expect(res.status, res.text).toBe(200);
    expect(res.json).toMatchObject({ kind: 'fork', state: 'succeeded', desktop_id: src.id, error: null });
    const ids: string[] = res.json.result.desktop_ids;
    expect(ids).toHaveLength(3);
    expect(new Set(ids).size).toBe(3);
    for (const id of ids) {
      const d = (await call('GET', `/v1/desktops/${id}`)).json;
      expect(d).toMatchObject({ state: 'hibernated', tier: 'small', billing_mode: 'monthly', image_version: 'debian-12', idle_timeout_secs: 1234, host_id: src.host_id });
    }
    const after = (await call('GET', `/v1/desktops/${src.id}`)).json;
    expect(after).toMatchObject({ state: 'hibernated', generation: src.generation, current_generation_id: src.current_generation_id });
    const events = await sql<Array<{ desktop_id: string }>>`SELECT desktop_id FROM outbox WHERE type = 'desktop.created' AND desktop_id = ANY(${ids})`;
    expect(events.map((e) => e.desktop_id).sort()).toEqual([...ids].sort());

    // Each copy has its own life: waking a fork leaves the source and the other forks alone.
    expect((await call('POST', `/v1/desktops/${ids[0]}/wake?wait=true`)).status).toBe(200);
    expect((await call('GET', `/v1/desktops/${ids[1]}`)).json.state).toBe('hibernated');
    expect((await call('GET', `/v1/desktops/${src.id}`)).json.state).toBe('hibernated');
    // The source can fork again, and be woken.
    expect((await fork(src.id, { count: 1, acknowledge_shared_state: true })).status).toBe(200);
    expect((await call('POST', `/v1/desktops/${src.id}/wake?wait=true`)).status).toBe(200);
    const forks = (await call('GET', '/v1/desktops')).json.desktops.filter((d: any) => d.id !== src.id && d.host_id === src.host_id);
    await destroyAll([src.id, ...forks.map((d: any) => d.id)]);
  });

  it('copies the guest files, and the copies diverge', async () => {
    const created = await call('POST', '/v1/desktops', { tier: 'small' });
    const id = created.json.id;
    await call('POST', `/v1/desktops/${id}/wake?wait=true`);
    const put = (d: string, text: string) =>
      fetch(`${s.url}/v1/desktops/${d}/files/root/note.txt`, { method: 'PUT', headers: { authorization: `Bearer ${key}` }, body: text });
    const get = async (d: string) => (await fetch(`${s.url}/v1/desktops/${d}/files/root/note.txt`, { headers: { authorization: `Bearer ${key}` } })).text();
    expect((await put(id, 'source')).status).toBe(204);
    await call('POST', `/v1/desktops/${id}/hibernate?wait=true`);
    const [a, b] = (await fork(id, { count: 2, acknowledge_shared_state: true })).json.result.desktop_ids;
    for (const d of [a, b, id]) await call('POST', `/v1/desktops/${d}/wake?wait=true`);
    expect(await get(a)).toBe('source');
    await put(a, 'changed in a');
    expect(await get(a)).toBe('changed in a');
    expect(await get(b)).toBe('source');
    expect(await get(id)).toBe('source');
    await destroyAll([id, a, b]);
  });

  it('answers 202 without wait; a repeated Idempotency-Key returns the same operation', async () => {
    const src = await hibernatedDesktop();
    const first = await call('POST', `/v1/desktops/${src.id}/fork`, { count: 1, acknowledge_shared_state: true }, { 'idempotency-key': 'fork-once' });
    expect(first.status).toBe(202);
    const again = await call('POST', `/v1/desktops/${src.id}/fork`, { count: 1, acknowledge_shared_state: true }, { 'idempotency-key': 'fork-once' });
    expect(again.json.id).toBe(first.json.id);
    const settled = await until(async () => {
      const op = (await call('GET', `/v1/operations/${first.json.id}`)).json;
      return op.state === 'succeeded' ? op : null;
    }, 10_000, 'the fork to settle');
    await destroyAll([src.id, ...settled.result.desktop_ids]);
  });

  it('gives ephemeral forks a 900 s idle timeout and destroys them at it, woken or not', async () => {
    const src = await hibernatedDesktop({ idle_timeout_secs: 60 });
    const [never, woken] = (await fork(src.id, { count: 2, acknowledge_shared_state: true, ephemeral: true })).json.result.desktop_ids;
    expect((await call('GET', `/v1/desktops/${never}`)).json.idle_timeout_secs).toBe(900);
    expect((await call('POST', `/v1/desktops/${woken}/wake?wait=true`)).status).toBe(200);
    // 901 s later (moved in the database rather than waited for):
    await sql`UPDATE desktops SET created_at = now() - interval '901 seconds', last_woken_at = now() - interval '901 seconds' WHERE id = ANY(${[never, woken]})`;
    for (const id of [never, woken]) {
      await until(async () => (await call('GET', `/v1/desktops/${id}`)).json.state === 'destroyed', 10_000, `${id} to be destroyed`);
    }
    // The source is not ephemeral: it stays.
    expect((await call('GET', `/v1/desktops/${src.id}`)).json.state).toBe('hibernated');
    await destroyAll([src.id]);
  });

  it('needs free storage slots on the source host: a failed operation without wait, 413 with it', async () => {
    const src = await hibernatedDesktop({ tier: 'large' }); // 4 of the host's 8 slots
    const waited = await fork(src.id, { count: 2, acknowledge_shared_state: true });
    expectProblem(waited, 413, 'two more large desktops');
    expect(waited.json.operation_id).toMatch(/^op_/);
    const op = (await call('GET', `/v1/operations/${waited.json.operation_id}`)).json;
    expect(op).toMatchObject({ kind: 'fork', state: 'failed', error: { code: 'no_capacity' } });
    const unwaited = await call('POST', `/v1/desktops/${src.id}/fork`, { count: 2, acknowledge_shared_state: true });
    expect(unwaited.status).toBe(200);
    expect(unwaited.json).toMatchObject({ state: 'failed', error: { code: 'no_capacity' } });
    // One more large desktop fits exactly.
    const one = await fork(src.id, { count: 1, acknowledge_shared_state: true });
    expect(one.status, one.text).toBe(200);
    await destroyAll([src.id, ...one.json.result.desktop_ids]);
  });

  it("counts the forks not made yet against the host's slots", async () => {
    const [a, b] = [await hibernatedDesktop(), await hibernatedDesktop()]; // 2 of the 8 slots
    const driver = agent.driver!;
    const forkCopies = driver.fork.bind(driver);
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    driver.fork = async (source, ids) => {
      await gate;
      return forkCopies(source, ids);
    };
    try {
      const first = await fork(a.id, { count: 4, acknowledge_shared_state: true }, '');
      expect(first.status, first.text).toBe(202);
      // The first one's copies are not made yet; its 4 slots are spoken for all the same.
      const second = await fork(b.id, { count: 4, acknowledge_shared_state: true }, '');
      expect(second.json).toMatchObject({ state: 'failed', error: { code: 'no_capacity' } });
      release();
      const made = await until(async () => {
        const op = (await call('GET', `/v1/operations/${first.json.id}`)).json;
        return op.state === 'succeeded' ? op : null;
      }, 10_000, 'the first fork');
      await destroyAll([a.id, b.id, ...made.result.desktop_ids]);
    } finally {
      driver.fork = forkCopies;
      release();
    }
  });
});
