/**
 * A move whose target is lost after the commit and before the desktop ever ran there. The
 * source still holds the copy the move stopped (disk and memory), and it is the only one left:
 * - while the target is down, the source's copy is not swept as stale, whatever hellos and
 *   leader terms pass (the record names the target, but the target may never come back);
 * - once an operator declares the target lost (`forget`), the desktop is placed back on the
 *   source, hibernated, and wakes there with its files, instead of being written off;
 * - a desktop that did run on the target after its move is written off as before: the source's
 *   copy is older than what its user saw.
 * Real scheduler and database, fake agents over real websockets.
 */
import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { adminApi, api, mintKey, settledOperation, startTestScheduler, TEST_ADMIN_TOKEN, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';

const CLI = join(import.meta.dirname, '..', '..', 'dist', 'cli.js');

/** Short, so a start failing to the deadline ends within the test. */
const DEADLINE_MS = 3_000;

let s: TestScheduler;
let sql: Sql;
let call: ReturnType<typeof api>;
let admin: ReturnType<typeof api>;
const agents: TestAgent[] = [];

beforeAll(async () => {
  s = await startTestScheduler({
    CANTO_ADMIN_TOKEN: TEST_ADMIN_TOKEN, CANTO_HEARTBEAT_MS: '200', CANTO_HOST_WAIT_MS: '1000', CANTO_OPERATION_DEADLINE_MS: String(DEADLINE_MS),
  });
  sql = connectDatabase(s.databaseUrl, { max: 2 });
  call = api(s.url, await mintKey(s.databaseUrl, 'move-target-lost'));
  admin = adminApi(s.url);
});

afterAll(async () => {
  for (const agent of agents) await agent.stop().catch(() => undefined);
  await sql?.end();
  await s?.close();
});


/** Two fresh hosts and an awake desktop on the first, holding /root/note. */
async function awakeOnSource(): Promise<{ id: string; source: TestAgent; target: TestAgent }> {
  const source = await startFakeAgent(s.url, { delayMs: 0 });
  agents.push(source);
  // Only the source takes the desktop (the hosts of earlier tests are cordoned meanwhile), and
  // the target joins after it is placed.
  await sql`UPDATE hosts SET cordoned = true WHERE id <> ${source.hostId}`;
  const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
  expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
  await sql`UPDATE hosts SET cordoned = false WHERE lost_at IS NULL`;
  expect((await call('GET', `/v1/desktops/${id}`)).json.host_id).toBe(source.hostId);
  const wrote = await call('PUT', `/v1/desktops/${id}/files/root/note`, 'written before the move', { 'content-type': 'application/octet-stream' });
  expect(wrote.status, wrote.text).toBe(204);
  const target = await startFakeAgent(s.url, { delayMs: 0 });
  agents.push(target);
  // A move is refused onto a host not yet ready (its hello is fenced first).
  await until(async () => {
    const host = (await admin('GET', `/admin/v1/hosts/${target.hostId}`)).json;
    return host.state === 'ready' && host.linked !== false;
  }, 10_000, 'the target to read ready');
  return { id, source, target };
}

/**
 * Moves `id` to `target`, whose agent goes away as the start is sent (the copy is installed and
 * committed there; the desktop never runs there), and waits for the move to fail on the start.
 */
async function moveIntoTheVoid(id: string, target: TestAgent): Promise<void> {
  const driver = target.driver!;
  driver.start = async () => {
    void target.stop(true);
    return new Promise(() => undefined);
  };
  const requested = await admin('POST', `/admin/v1/desktops/${id}/move`, { host_id: target.hostId });
  expect(requested.status, requested.text).toBe(202);
  const op = await settledOperation(admin, requested.json.id as string);
  expect(op.state).toBe('failed');
  expect((await call('GET', `/v1/desktops/${id}`)).json).toMatchObject({ state: 'hibernated', host_id: target.hostId });
}

/**
 * Declares `host` lost (once it reads down: silent past the down limit) until its record is gone;
 * the first ask goes twice at once, as a retrying client or two operators would send it.
 */
async function forget(host: TestAgent): Promise<any[]> {
  await until(async () => (await admin('GET', `/admin/v1/hosts/${host.hostId}`)).json.state === 'down', 10_000, 'the host to read down');
  const answers: any[] = [];
  for (const res of await Promise.all([0, 1].map(() => admin('POST', `/admin/v1/hosts/${host.hostId}/forget`, {})))) {
    expect(res.status, res.text).toBe(200);
    answers.push(res.json);
  }
  if (answers.some((a) => a.removed === true)) return answers;
  await until(async () => {
    const res = await admin('POST', `/admin/v1/hosts/${host.hostId}/forget`, {});
    expect(res.status, res.text).toBe(200);
    answers.push(res.json);
    return res.json.removed === true;
  }, 20_000, 'the lost host to be removed');
  return answers;
}

it('keeps the source copy while the target is down, and places the desktop back there when the target is declared lost', async () => {
  const { id, source, target } = await awakeOnSource();
  await moveIntoTheVoid(id, target);
  expect(source.driver!.desktops.has(id)).toBe(true);

  // The source says hello again (an agent restart): the record names the target, which is down.
  await source.stop(true);
  const back = await startFakeAgent(s.url, { again: { stateDir: source.stateDir, driver: source.driver! } });
  agents[agents.indexOf(source)] = back;
  // A hello's sweep runs in the desktop's queue right after the link: give it time to act.
  await new Promise((resolve) => setTimeout(resolve, 1_500));
  expect(back.driver!.desktops.has(id)).toBe(true);

  // Through the CLI, as an operator does: its JSON names the desktop placed back, whichever of
  // its calls placed it (the last call's answer alone names none).
  await until(async () => (await admin('GET', `/admin/v1/hosts/${target.hostId}`)).json.state === 'down', 10_000, 'the host to read down');
  const { stdout } = await promisify(execFile)(process.execPath, [CLI, 'hosts', 'forget', target.hostId, '--yes', '--wait', '--json', '--api', s.url], {
    env: { PATH: process.env.PATH, HOME: process.env.HOME, CANTO_ADMIN_TOKEN: TEST_ADMIN_TOKEN, CANTO_DATA_DIR: '/nonexistent' }, timeout: 30_000,
  });
  const forgotten = JSON.parse(stdout) as { removed: boolean; placed_back: Array<{ desktop_id: string; host_id: string }> };
  expect(forgotten).toMatchObject({ removed: true, placed_back: [{ desktop_id: id, host_id: back.hostId }] });
  expect((await call('GET', `/v1/desktops/${id}`)).json).toMatchObject({ state: 'hibernated', host_id: back.hostId });
  const woke = await call('POST', `/v1/desktops/${id}/wake?wait=true`);
  expect(woke.status, woke.text).toBe(200);
  expect((await call('GET', `/v1/desktops/${id}`)).json).toMatchObject({ state: 'awake', host_id: back.hostId });
  const note = await call('GET', `/v1/desktops/${id}/files/root/note`);
  expect(note.text).toBe('written before the move');
  const destroyed = await sql`SELECT 1 FROM outbox WHERE desktop_id = ${id} AND type = 'desktop.destroyed'`;
  expect(destroyed).toHaveLength(0);
}, 90_000);

it('writes off a desktop whose target came back after the failed move, the source copy swept meanwhile', async () => {
  const { id, source, target } = await awakeOnSource();
  const start = target.driver!.start.bind(target.driver!);
  await moveIntoTheVoid(id, target);
  // The target comes back, and the source says hello while it is there: the source's copy goes,
  // the target's is the desktop now (a wake would run it there).
  const returned = await startFakeAgent(s.url, { again: { stateDir: target.stateDir, driver: target.driver! } });
  agents[agents.indexOf(target)] = returned;
  returned.driver!.start = start;
  await until(async () => (await admin('GET', `/admin/v1/hosts/${returned.hostId}`)).json.state === 'ready', 10_000, 'the target to read ready');
  await source.stop(true);
  const back = await startFakeAgent(s.url, { again: { stateDir: source.stateDir, driver: source.driver! } });
  agents[agents.indexOf(source)] = back;
  await until(() => !back.driver!.desktops.has(id), 10_000, 'the source copy to be swept');
  // Then the target is gone for good: nothing is left to place the desktop back on.
  await returned.stop(true);
  const answers = await forget(returned);
  expect(answers.reduce((n, a) => n + a.placed_back.length, 0)).toBe(0);
  await until(async () => (await call('GET', `/v1/desktops/${id}`)).json.state === 'destroyed', 10_000, 'the desktop to be written off');
}, 90_000);

it('sweeps a copy a finished move left on its source even while the desktop\'s host is down', async () => {
  const { id, source, target } = await awakeOnSource();
  // The source goes between the commit and its copy's removal: the move succeeds, its copy stays.
  const destroy = source.driver!.destroy.bind(source.driver!);
  source.driver!.destroy = async () => {
    void source.stop(true);
    return new Promise(() => undefined);
  };
  const requested = await admin('POST', `/admin/v1/desktops/${id}/move`, { host_id: target.hostId });
  expect(requested.status, requested.text).toBe(202);
  const op = await settledOperation(admin, requested.json.id as string);
  expect(op).toMatchObject({ state: 'succeeded', result: { source_cleaned: false } });
  source.driver!.destroy = destroy;
  // The desktop's host goes down; the source comes back and says hello.
  await target.stop(true);
  await until(async () => (await admin('GET', `/admin/v1/hosts/${target.hostId}`)).json.state === 'down', 10_000, 'the target to read down');
  const back = await startFakeAgent(s.url, { again: { stateDir: source.stateDir, driver: source.driver! } });
  agents[agents.indexOf(source)] = back;
  await until(() => !back.driver!.desktops.has(id), 10_000, 'the leftover copy to be swept');
}, 90_000);
