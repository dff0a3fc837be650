/**
 * Moving desktops and draining hosts through the admin API, on a real scheduler and database
 * with fake agents over real websockets (their transfer servers on real sockets too): a move
 * carries the desktop's files to the other host, an awake one comes back awake, generation and
 * host change and nothing else does; a desktop between hosts answers guest calls 503 with
 * Retry-After; a drain empties its host, which can then be removed once its agent is gone; a
 * drain that could not finish is refused up front and changes nothing.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { adminApi, api, mintKey, startTestScheduler, TEST_ADMIN_TOKEN, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { expectProblem } from '../helpers/problem.js';
import { connectDatabase } from '../../scheduler/src/store/db.js';


let s: TestScheduler;
let call: ReturnType<typeof api>;
let admin: ReturnType<typeof api>;
const agents: TestAgent[] = [];

async function settled(operationId: string): Promise<any> {
  return until(async () => {
    const op = (await admin('GET', `/admin/v1/operations/${operationId}`)).json;
    return op.state === 'succeeded' || op.state === 'failed' ? op : null;
  }, 20_000, `operation ${operationId} to settle`);
}

/** A desktop, woken (so it is placed and its files can be written). */
async function newDesktop(): Promise<string> {
  const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
  expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
  return id;
}

async function writeFile(id: string, path: string, content: string): Promise<void> {
  const res = await call('PUT', `/v1/desktops/${id}/files/${path}`, content, { 'content-type': 'application/octet-stream' });
  expect(res.status, res.text).toBeLessThan(300);
}

async function readFile(id: string, path: string): Promise<string> {
  const res = await call('GET', `/v1/desktops/${id}/files/${path}`);
  expect(res.status, res.text).toBe(200);
  return res.text;
}

/** What a user's meter, idle timer and webhooks see of a desktop. */
async function moveInvisible(id: string) {
  const sql = connectDatabase(s.databaseUrl, { max: 1 });
  try {
    const meters = await sql<Array<{ started_at: Date; ended_at: Date | null }>>`
      SELECT started_at, ended_at FROM meter_intervals WHERE desktop_id = ${id} ORDER BY started_at`;
    const [row] = await sql<Array<{ last_woken_at: Date | null }>>`SELECT last_woken_at FROM desktops WHERE id = ${id}`;
    const events = await sql<Array<{ type: string }>>`SELECT type FROM outbox WHERE desktop_id = ${id} ORDER BY id`;
    return { meters: [...meters], lastWokenAt: row!.last_woken_at, events: events.map((e) => e.type) };
  } finally {
    await sql.end();
  }
}

beforeAll(async () => {
  s = await startTestScheduler({ CANTO_ADMIN_TOKEN: TEST_ADMIN_TOKEN, CANTO_HEARTBEAT_MS: '200' });
  call = api(s.url, await mintKey(s.databaseUrl, 'movers'));
  admin = adminApi(s.url);
  for (let i = 0; i < 3; i++) agents.push(await startFakeAgent(s.url));
});

afterAll(async () => {
  for (const agent of agents) await agent.stop();
  await s?.close();
});

describe('POST /admin/v1/desktops/{id}/move', () => {
  it('moves an awake desktop with its files; it comes back awake on the other host', async () => {
    const id = await newDesktop();
    await writeFile(id, 'root/notes.txt', 'kept across hosts');
    const before = (await call('GET', `/v1/desktops/${id}`)).json;
    const untouched = await moveInvisible(id);
    expect(untouched.meters).toEqual([{ started_at: expect.any(Date), ended_at: null }]);
    const requested = await admin('POST', `/admin/v1/desktops/${id}/move`, {});
    expect(requested.status, requested.text).toBe(202);
    expect(requested.json).toMatchObject({ kind: 'move', desktop_id: id, reason: 'admin', source_host_id: before.host_id });
    const op = await settled(requested.json.id);
    expect(op.state, JSON.stringify(op.error)).toBe('succeeded');
    expect(op.result).toMatchObject({ source_host_id: before.host_id, was_awake: true, source_cleaned: true });
    expect(op.result.target_host_id).not.toBe(before.host_id);
    expect(op.result.downtime_ms).toBeGreaterThanOrEqual(0);
    const after = (await call('GET', `/v1/desktops/${id}`)).json;
    expect(after).toMatchObject({ state: 'awake', host_id: op.result.target_host_id });
    expect(after.generation).toBeGreaterThan(before.generation);
    expect(await readFile(id, 'root/notes.txt')).toBe('kept across hosts');
    // For its user nothing happened: the meter runs on in the interval it was in, the idle timer
    // counts from the same wake, and no lifecycle event went out.
    expect(await moveInvisible(id)).toEqual(untouched);
    // The org sees the operation too, as a move.
    expect((await call('GET', `/v1/operations/${op.id}`)).json).toMatchObject({ kind: 'move', state: 'succeeded' });
  });

  it('moves a hibernated desktop to the host it is told', async () => {
    const id = await newDesktop();
    await writeFile(id, 'root/a.bin', 'x'.repeat(100_000));
    expect((await call('POST', `/v1/desktops/${id}/hibernate?wait=true`)).status).toBe(200);
    const from = (await call('GET', `/v1/desktops/${id}`)).json.host_id as string;
    const to = agents.map((a) => a.hostId).find((h) => h !== from)!;
    const op = await settled((await admin('POST', `/admin/v1/desktops/${id}/move`, { host_id: to })).json.id);
    expect(op.state, JSON.stringify(op.error)).toBe('succeeded');
    expect((await call('GET', `/v1/desktops/${id}`)).json).toMatchObject({ state: 'hibernated', host_id: to });
    expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
    expect(await readFile(id, 'root/a.bin')).toBe('x'.repeat(100_000));
  });

  it('moves a desktop back to the host it just left, awake and hibernated', async () => {
    const id = await newDesktop();
    await writeFile(id, 'root/roundtrip.txt', 'there and back');
    const home = (await call('GET', `/v1/desktops/${id}`)).json.host_id as string;
    const away = agents.map((a) => a.hostId).find((h) => h !== home)!;
    for (const [to, state] of [[away, 'awake'], [home, 'awake'], [away, 'awake']] as const) {
      const op = await settled((await admin('POST', `/admin/v1/desktops/${id}/move`, { host_id: to })).json.id);
      expect(op.state, JSON.stringify(op.error)).toBe('succeeded');
      expect((await call('GET', `/v1/desktops/${id}`)).json).toMatchObject({ state, host_id: to });
    }
    expect((await call('POST', `/v1/desktops/${id}/hibernate?wait=true`)).status).toBe(200);
    const back = await settled((await admin('POST', `/admin/v1/desktops/${id}/move`, { host_id: home })).json.id);
    expect(back.state, JSON.stringify(back.error)).toBe('succeeded');
    expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
    expect(await readFile(id, 'root/roundtrip.txt')).toBe('there and back');
  });

  it('refuses what cannot move: unknown desktop 404, unknown host 404, its own host 409, a destroyed desktop 409', async () => {
    expectProblem(await admin('POST', '/admin/v1/desktops/dsk_000000000000000000000000/move', {}), 404);
    const id = await newDesktop();
    expectProblem(await admin('POST', `/admin/v1/desktops/${id}/move`, { host_id: 'host_000000000000000000000000' }), 404);
    const here = await admin('POST', `/admin/v1/desktops/${id}/move`, { host_id: (await call('GET', `/v1/desktops/${id}`)).json.host_id });
    expectProblem(here, 409);
    expect(here.json.detail).toBe('the desktop is already on that host');
    expect((await call('POST', `/v1/desktops/${id}/destroy?wait=true`)).status).toBe(200);
    expectProblem(await admin('POST', `/admin/v1/desktops/${id}/move`, {}), 409);
    expectProblem(await admin('POST', `/admin/v1/desktops/${id}/move`, { to: 'x' }), 400);
  });

  it('refuses a second move while the first is open, naming it', async () => {
    const id = await newDesktop();
    const first = await admin('POST', `/admin/v1/desktops/${id}/move`, {});
    expect(first.status, first.text).toBe(202);
    // A move takes several agent round trips and transactions: the first is still open here.
    const second = await admin('POST', `/admin/v1/desktops/${id}/move`, {});
    expectProblem(second, 409);
    expect(second.json.detail).toBe(`the desktop's move (operation ${first.json.id}) is in progress; retry once it settles`);
    expect((await settled(first.json.id)).state).toBe('succeeded');
  });

  it('answers guest calls 503 with Retry-After while the desktop is between hosts', async () => {
    const id = await newDesktop();
    const sql = connectDatabase(s.databaseUrl, { max: 1 });
    try {
      await sql`UPDATE desktops SET moving_operation_id = 'op_000000000000000000000000' WHERE id = ${id}`;
      const res = await until(async () => {
        const r = await call('POST', `/v1/desktops/${id}/exec`, { command: 'true' });
        return r.status === 503 ? r : null;
      }, 5_000, 'exec to see the move');
      expectProblem(res, 503);
      expect(res.headers.get('retry-after')).toBe('1');
      expect(res.json.detail).toMatch(/moving to another host/);
    } finally {
      await sql`UPDATE desktops SET moving_operation_id = NULL WHERE id = ${id}`;
      await sql.end();
    }
    await until(async () => (await call('POST', `/v1/desktops/${id}/exec`, { command: 'true' })).status === 200, 5_000, 'exec to work again');
  });
});

describe('POST /admin/v1/hosts/{id}/drain', () => {
  it('is refused, changing nothing, when the other hosts have no room', async () => {
    const id = await newDesktop();
    const host = (await call('GET', `/v1/desktops/${id}`)).json.host_id as string;
    const others = agents.map((a) => a.hostId).filter((h) => h !== host);
    for (const h of others) expect((await admin('POST', `/admin/v1/hosts/${h}/cordon`)).status).toBe(200);
    try {
      const refused = await admin('POST', `/admin/v1/hosts/${host}/drain`, {});
      expectProblem(refused, 409);
      expect(refused.json.detail).toMatch(/lack capacity.*nothing was changed/);
      expect((await admin('GET', `/admin/v1/hosts/${host}`)).json).toMatchObject({ cordoned: false, drain: null });
    } finally {
      for (const h of others) await admin('POST', `/admin/v1/hosts/${h}/uncordon`);
    }
  });

  it('moves every desktop off the host, awake ones awake, and the emptied host can be removed once its agent stops', async () => {
    const ids = [];
    for (let i = 0; i < 4; i++) ids.push(await newDesktop());
    for (const id of ids) await writeFile(id, 'root/who', id);
    await call('POST', `/v1/desktops/${ids[0]}/hibernate?wait=true`);
    const byHost = new Map<string, string[]>();
    for (const id of ids) {
      const h = (await call('GET', `/v1/desktops/${id}`)).json.host_id as string;
      byHost.set(h, [...(byHost.get(h) ?? []), id]);
    }
    const [host] = [...byHost.entries()].sort((a, b) => b[1].length - a[1].length)[0]!;
    const states = new Map<string, string>();
    for (const id of ids) states.set(id, (await call('GET', `/v1/desktops/${id}`)).json.state);

    const started = await admin('POST', `/admin/v1/hosts/${host}/drain`, { parallel: 2 });
    expect(started.status, started.text).toBe(202);
    expect(started.json).toMatchObject({ cordoned: true, schedulable: false, drain: { state: 'draining', parallel: 2, finished_at: null } });
    const drained = await until(async () => {
      const h = (await admin('GET', `/admin/v1/hosts/${host}`)).json;
      if (h.drain?.state === 'stopped') throw new Error(`drain stopped: ${h.drain.error}`);
      return h.drain?.state === 'drained' ? h : null;
    }, 30_000, 'the drain to finish');
    expect(drained.desktops.total).toBe(0);
    expect(drained.drain).toMatchObject({ remaining: 0, failed: 0, running: 0 });
    // When it ended, by the server's clock: no earlier than it was asked for.
    expect(Date.parse(drained.drain.finished_at)).toBeGreaterThanOrEqual(Date.parse(drained.drain.requested_at));
    for (const id of ids) {
      const d = (await call('GET', `/v1/desktops/${id}`)).json;
      expect(d.host_id).not.toBe(host);
      expect(d.state).toBe(states.get(id));
      if (d.state === 'awake') expect(await readFile(id, 'root/who')).toBe(id);
    }
    // Removing it needs its agent gone.
    expectProblem(await admin('DELETE', `/admin/v1/hosts/${host}`), 409);
    const agent = agents.find((a) => a.hostId === host)!;
    await agent.stop();
    agents.splice(agents.indexOf(agent), 1);
    await until(async () => (await admin('GET', `/admin/v1/hosts/${host}`)).json.state === 'down', 10_000, 'the host to read down');
    const down = await admin('POST', `/admin/v1/hosts/${host}/drain`, {});
    expectProblem(down, 409);
    expect(down.json.detail).toMatch(/the host is down/);
    const removed = await admin('DELETE', `/admin/v1/hosts/${host}`);
    expect(removed.status, removed.text).toBe(204);
  });
});
