/**
 * Host failure recovery with a real scheduler and a real agent link (FakeDriver runtime): a host
 * that goes silent past the grace period has its awake desktops force-hibernated (event reason
 * `host_failure`, meter closed, generation bumped); when the host returns still running the
 * desktop, its hello is reconciled and the desktop is hibernated there with the new generation,
 * so the next wake restores its memory.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startAgent, type AgentHandle } from '../../agent/src/channel.js';
import { loadAgentConfig } from '../../agent/src/config.js';
import { FakeDriver } from '../../agent/src/runtime/fake.js';
import { silentLogger } from '../../shared/src/log.js';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { api, JOIN_TOKEN, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';

const GRACE_MS = 400;

describe('host failure recovery', () => {
  let s: TestScheduler;
  let sql: Sql;
  let stateDir: string;
  let agent: AgentHandle | null = null;
  const driver = new FakeDriver();

  beforeAll(async () => {
    s = await startTestScheduler({ CANTO_HOST_FAILURE_GRACE_MS: String(GRACE_MS), CANTO_HEARTBEAT_MS: '50' });
    sql = connectDatabase(s.databaseUrl, { max: 1 });
    stateDir = mkdtempSync(join(tmpdir(), 'canto-recovery-'));
  });

  afterAll(async () => {
    await agent?.stop();
    await sql.end();
    await s.close();
    rmSync(stateDir, { recursive: true, force: true });
  });

  async function connectAgent(): Promise<AgentHandle> {
    const config = loadAgentConfig({
      CANTO_SCHEDULER_URL: s.url,
      CANTO_AGENT_TOKEN: JOIN_TOKEN,
      CANTO_AGENT_STATE_DIR: stateDir,
      CANTO_AGENT_RECONNECT_MAX_MS: '100',
      CANTO_AGENT_STREAM_LISTEN: '127.0.0.1:0',
      CANTO_AGENT_INGRESS_LISTEN: '127.0.0.1:0',
    });
    const handle = await startAgent({ config, driver, logger: silentLogger() });
    await handle.waitConnected(5_000);
    return handle;
  }

  it('force-hibernates the desktops of a silent host, then reconciles them when it returns', async () => {
    agent = await connectAgent();
    const call = api(s.url, await mintKey(s.databaseUrl, 'recovery'));
    const id: string = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id;
    expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
    const awake = (await call('GET', `/v1/desktops/${id}`)).json;

    // A host that keeps heartbeating is never failed, however long it is up.
    await new Promise((r) => setTimeout(r, GRACE_MS * 2));
    expect((await call('GET', `/v1/desktops/${id}`)).json.state).toBe('awake');

    // The host goes silent; its desktop keeps running there.
    await agent.stop();
    agent = null;
    const recovered = await until(async () => {
      const d = (await call('GET', `/v1/desktops/${id}`)).json;
      return d.state === 'hibernated' ? d : null;
    }, 10_000, 'forced hibernation');
    expect(recovered.generation).toBeGreaterThan(awake.generation);
    const events = await sql`SELECT type, payload FROM outbox WHERE desktop_id = ${id} ORDER BY id`;
    expect(events.at(-1)!.type).toBe('desktop.hibernated');
    expect(events.at(-1)!.payload.data.reason).toBe('host_failure');
    const [meter] = await sql`SELECT count(*)::int AS open FROM meter_intervals WHERE desktop_id = ${id} AND ended_at IS NULL`;
    expect(meter!.open).toBe(0);
    expect(driver.desktops.get(id)!.running).toBe(true);

    // The host returns: its hello reports the desktop running, and the scheduler hibernates it
    // there with the current generation, keeping its memory.
    agent = await connectAgent();
    await until(() => driver.desktops.get(id)!.running === false, 5_000, 'reconciliation');
    expect(driver.desktops.get(id)!.hasSnapshot).toBe(true);
    const woke = await call('POST', `/v1/desktops/${id}/wake?wait=true`);
    expect(woke.status, woke.text).toBe(200);
    expect(woke.json.result.restored).toBe(true);
  });
});
