/**
 * A hibernate or destroy still open when its host goes silent (the host took the command and
 * never answered): the operation fails once its deadline passes (`host_unavailable`), the desktop
 * is then force-hibernated like any awake desktop of a silent host, and its meter ends when the
 * host was last heard from (its last heartbeats), not when the operation or the sweep ended:
 * nothing is billed for the outage. Real scheduler and database, a fake agent over a real websocket.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { FakeDriver } from '../../agent/src/runtime/fake.js';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { startAgentOver } from '../helpers/agent.js';
import { api, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';

let s: TestScheduler;
let sql: Sql;
let stateDir: string;
let call: ReturnType<typeof api>;
const driver = new FakeDriver();

beforeAll(async () => {
  s = await startTestScheduler({
    CANTO_HOST_FAILURE_GRACE_MS: '800', CANTO_HEARTBEAT_MS: '50', CANTO_HOST_DOWN_MS: '300', CANTO_OPERATION_DEADLINE_MS: '2000',
  });
  sql = connectDatabase(s.databaseUrl, { max: 1 });
  stateDir = mkdtempSync(join(tmpdir(), 'canto-open-ops-'));
  call = api(s.url, await mintKey(s.databaseUrl, 'open-ops'));
});

afterAll(async () => {
  await sql?.end();
  await s?.close();
  rmSync(stateDir, { recursive: true, force: true });
});

for (const kind of ['hibernate', 'destroy'] as const) {
  it(`bills a desktop whose ${kind} was open when its host went silent only until the host was last heard`, async () => {
    const agent = await startAgentOver(s.url, stateDir, driver);
    const id: string = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id;
    expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
    // The host takes the command and dies before it answers.
    let stoppedAt = 0;
    const methods = driver as unknown as Record<typeof kind, (...args: unknown[]) => Promise<unknown>>;
    const own = methods[kind];
    methods[kind] = () => new Promise<never>(() => {});
    try {
      const asked = await call('POST', `/v1/desktops/${id}/${kind}`);
      expect(asked.status).toBe(202);
      await until(async () => (await sql`SELECT 1 FROM operations WHERE id = ${asked.json.id} AND state = 'running'`).length > 0, 5_000, `the ${kind} to run`);
      await agent.stop();
      stoppedAt = Date.now();
    } finally {
      methods[kind] = own;
    }
    const failed = await until(async () => {
      const [op] = await sql`SELECT state, error, settled_at FROM operations WHERE desktop_id = ${id} AND kind = ${kind}`;
      return op?.state === 'failed' ? op : null;
    }, 15_000, `the ${kind} to fail`);
    expect(failed.error).toMatchObject({ code: 'host_unavailable' });
    const d = await until(async () => {
      const got = (await call('GET', `/v1/desktops/${id}`)).json;
      return got.state === 'hibernated' ? got : null;
    }, 10_000, 'the desktop to be force-hibernated');
    expect(d.host_status).toBe('down');
    const [meter, ...more] = await sql`SELECT ended_at FROM meter_intervals WHERE desktop_id = ${id}`;
    expect(more).toHaveLength(0);
    // Ended with the host's last heartbeats (every 50 ms), not at the operation's failure (its
    // deadline, 2 s on) nor at the sweep after it.
    const ended = (meter!.ended_at as Date).getTime();
    expect(ended).toBeLessThanOrEqual(stoppedAt + 100);
    expect(ended).toBeLessThan((failed.settled_at as Date).getTime() - 1_000);
    const events = await sql`SELECT type, payload->'data' AS data FROM outbox WHERE desktop_id = ${id} AND type = 'desktop.hibernated'`;
    expect(events).toHaveLength(1);
    expect(events[0]!.data).toMatchObject({ reason: 'host_failure', cause: 'host_silent' });
  }, 40_000);
}
