/**
 * Host failure recovery with a real scheduler and a real agent link (FakeDriver runtime):
 *
 * - a host that goes silent reads `down` within CANTO_HOST_DOWN_MS, and its desktops show it;
 * - past the grace period its awake desktops are force-hibernated (reason `host_failure`, cause
 *   `host_silent`, generation bumped) with the meter closed when the host was last heard from;
 * - when the host returns still running one, its agent stops it (memory kept) before the host
 *   reads ready, so nothing runs unbilled, and the next wake restores it;
 * - a desktop recorded awake that its relinked host no longer runs is recorded hibernated
 *   (cause `guest_gone`), its meter closed when the previous agent was last heard from;
 * - a check the host could not answer is asked again.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { LINK_WAIT_MS } from '../../scheduler/src/services/first-link.js';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { AgentHandle } from '../../agent/src/channel.js';
import { FakeDriver } from '../../agent/src/runtime/fake.js';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { startAgentOver } from '../helpers/agent.js';
import { api, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';

const GRACE_MS = 800;
const HEARTBEAT_MS = 50;
const DOWN_MS = 300;

describe('host failure recovery', () => {
  let s: TestScheduler;
  let sql: Sql;
  let stateDir: string;
  let agent: AgentHandle | null = null;
  let call: ReturnType<typeof api>;
  const driver = new FakeDriver();

  beforeAll(async () => {
    s = await startTestScheduler({ CANTO_HOST_FAILURE_GRACE_MS: String(GRACE_MS), CANTO_HEARTBEAT_MS: String(HEARTBEAT_MS), CANTO_HOST_DOWN_MS: String(DOWN_MS) });
    sql = connectDatabase(s.databaseUrl, { max: 1 });
    stateDir = mkdtempSync(join(tmpdir(), 'canto-recovery-'));
    call = api(s.url, await mintKey(s.databaseUrl, 'recovery'));
  });

  afterEach(async () => {
    await agent?.stop();
    agent = null;
  });

  afterAll(async () => {
    await sql.end();
    await s.close();
    rmSync(stateDir, { recursive: true, force: true });
  });

  const connectAgent = (): Promise<AgentHandle> => startAgentOver(s.url, stateDir, driver);

  async function awakeDesktop(): Promise<{ id: string; generation: number }> {
    const id: string = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id;
    expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
    return (await call('GET', `/v1/desktops/${id}`)).json;
  }

  const hostStatus = async (hostId: string) => (await sql`SELECT status, last_seen_at FROM hosts WHERE id = ${hostId}`)[0]!;

  it('force-hibernates the desktops of a silent host, and the host stops them before it reads ready', async () => {
    agent = await connectAgent();
    const hostId = agent.hostId;
    const awake = await awakeDesktop();
    const id = awake.id;
    expect((await call('GET', `/v1/desktops/${id}`)).json.host_status).toBe('ready');

    // A host that keeps heartbeating is never failed, however long it is up.
    await new Promise((r) => setTimeout(r, GRACE_MS * 2));
    expect((await call('GET', `/v1/desktops/${id}`)).json).toMatchObject({ state: 'awake', host_status: 'ready' });

    // The host goes silent; its desktop keeps running there. It reads down within the limit.
    await agent.stop();
    agent = null;
    const silentAt = Date.now();
    await until(async () => (await call('GET', `/v1/desktops/${id}`)).json.host_status === 'down', 2_000, 'the host to read down');
    expect(Date.now() - silentAt).toBeLessThan(DOWN_MS + 1_000);
    // Down, it is answered at once: no wait for a link that is only forming (services/guest.ts).
    const askedAt = performance.now();
    expect((await call('POST', `/v1/desktops/${id}/exec`, { command: 'true' })).status).toBe(503);
    expect(performance.now() - askedAt).toBeLessThan(LINK_WAIT_MS / 2);
    const lastHeard = (await hostStatus(hostId)).last_seen_at as Date;

    const recovered = await until(async () => {
      const d = (await call('GET', `/v1/desktops/${id}`)).json;
      return d.state === 'hibernated' ? d : null;
    }, 10_000, 'forced hibernation');
    expect(recovered.generation).toBeGreaterThan(awake.generation);
    const events = await sql`SELECT type, payload FROM outbox WHERE desktop_id = ${id} ORDER BY id`;
    expect(events.at(-1)!.type).toBe('desktop.hibernated');
    // Whether memory is kept is not known while the host is unreachable: null, not false.
    expect(events.at(-1)!.payload.data).toEqual({ reason: 'host_failure', cause: 'host_silent', host_id: hostId, memory_snapshot: null });
    // The meter closed when the host was last heard from, not when the sweep noticed.
    const [meter] = await sql`SELECT ended_at FROM meter_intervals WHERE desktop_id = ${id}`;
    expect((meter!.ended_at as Date).getTime()).toBe(lastHeard.getTime());
    expect(driver.desktops.get(id)!.running).toBe(true);

    // The host returns: it stops the desktop (keeping its memory) before it reads ready.
    agent = await connectAgent();
    await until(async () => (await hostStatus(hostId)).status === 'ready', 5_000, 'the host to read ready');
    expect(driver.desktops.get(id)!.running).toBe(false);
    expect(driver.desktops.get(id)!.hasSnapshot).toBe(true);
    const woke = await call('POST', `/v1/desktops/${id}/wake?wait=true`);
    expect(woke.status, woke.text).toBe(200);
    expect(woke.json.result.restored).toBe(true);
  });

  it('records hibernated a desktop its relinked host no longer runs, billed until the old agent was last heard', async () => {
    agent = await connectAgent();
    const { id, generation } = await awakeDesktop();
    await agent.stop();
    agent = null;
    const stoppedAt = new Date();
    // The host rebooted: the desktop's processes are gone (its disk is not).
    driver.desktops.get(id)!.running = false;
    await new Promise((r) => setTimeout(r, 200));

    agent = await connectAgent();
    const gone = await until(async () => {
      const d = (await call('GET', `/v1/desktops/${id}`)).json;
      return d.state === 'hibernated' ? d : null;
    }, 5_000, 'the lost desktop to be recorded hibernated');
    expect(gone.generation).toBeGreaterThan(generation);
    const [event] = await sql`SELECT payload FROM outbox WHERE desktop_id = ${id} AND type = 'desktop.hibernated'`;
    expect(event!.payload.data).toMatchObject({ reason: 'host_failure', cause: 'guest_gone', memory_snapshot: false });
    const [meter] = await sql`SELECT ended_at FROM meter_intervals WHERE desktop_id = ${id}`;
    expect((meter!.ended_at as Date).getTime()).toBeLessThanOrEqual(stoppedAt.getTime() + 50);
    // Never "awake but not running": the next wake boots it.
    const woke = await call('POST', `/v1/desktops/${id}/wake?wait=true`);
    expect(woke.status, woke.text).toBe(200);
    expect(driver.desktops.get(id)!.running).toBe(true);
  });

  it('records hibernated a desktop whose guest died under a running agent, once a call finds it gone', async () => {
    agent = await connectAgent();
    const { id, generation } = await awakeDesktop();
    // The guest dies (the OOM killer took its init); the agent, still linked, says nothing.
    driver.desktops.get(id)!.running = false;
    const diedBy = new Date();
    const exec = await call('POST', `/v1/desktops/${id}/exec`, { command: 'true' });
    expect(exec.status, exec.text).toBe(409);
    const gone = await until(async () => {
      const d = (await call('GET', `/v1/desktops/${id}`)).json;
      return d.state === 'hibernated' ? d : null;
    }, 5_000, 'the dead desktop to be recorded hibernated');
    expect(gone.generation).toBeGreaterThan(generation);
    const events = await sql`SELECT payload FROM outbox WHERE desktop_id = ${id} AND type = 'desktop.hibernated'`;
    expect(events).toHaveLength(1);
    expect(events[0]!.payload.data).toMatchObject({ reason: 'host_failure', cause: 'guest_gone', host_id: agent.hostId, memory_snapshot: false });
    // Billed until the scheduler learnt of it: the death itself was not seen.
    const [meter] = await sql`SELECT ended_at FROM meter_intervals WHERE desktop_id = ${id}`;
    expect((meter!.ended_at as Date).getTime()).toBeGreaterThanOrEqual(diedBy.getTime());
    const woke = await call('POST', `/v1/desktops/${id}/wake?wait=true`);
    expect(woke.status, woke.text).toBe(200);
    expect(driver.desktops.get(id)!.running).toBe(true);
  });

  it('asks again when the host does not answer whether a desktop it may have lost still runs', async () => {
    agent = await connectAgent();
    const { id } = await awakeDesktop();
    driver.desktops.get(id)!.running = false;
    // The first question about it fails (an agent too busy to answer in time, say).
    const status = driver.status.bind(driver);
    let failed = 0;
    driver.status = async (desktopId) => {
      if (desktopId === id && failed++ === 0) throw new Error('the host could not say');
      return status(desktopId);
    };
    try {
      const exec = await call('POST', `/v1/desktops/${id}/exec`, { command: 'true' });
      expect(exec.status, exec.text).toBe(409);
      await until(async () => (await call('GET', `/v1/desktops/${id}`)).json.state === 'hibernated', 5_000, 'the dead desktop to be recorded hibernated');
      expect(failed).toBeGreaterThanOrEqual(2);
    } finally {
      driver.status = status;
    }
  });

  it('leaves awake a desktop whose host refused a call only because it was stopping', async () => {
    agent = await connectAgent();
    const { id, generation } = await awakeDesktop();
    // What a replica reports when the host answered "not running" for a desktop it does run (a
    // stop's fence refuses calls): the leader asks the host, which runs it, and nothing changes.
    await sql`SELECT pg_notify('canto_guest_gone', ${id})`;
    await new Promise((r) => setTimeout(r, 500));
    const d = (await call('GET', `/v1/desktops/${id}`)).json;
    expect(d).toMatchObject({ state: 'awake', generation });
    expect((await call('POST', `/v1/desktops/${id}/exec`, { command: 'true' })).status).toBe(200);
  });
});

