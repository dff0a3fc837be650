/**
 * A host that runs more desktops than its records let run there (one awake on the host while the
 * database says hibernated: it runs unbilled and out of sight) is recorded from its heartbeats
 * (`hosts.unrecorded_since`), shown by the admin API, and named by `canto status` once it has
 * lasted past a template build or a move's commit. Agreeing again clears it.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { readFleetStatus } from '../../cli/src/status.js';

const ADMIN_TOKEN = 'test-admin-token-0123456789abcdefghijklmnop';

let s: TestScheduler;
let agent: TestAgent;
let sql: Sql;
/** What the agent's heartbeats report as running, on top of what its driver runs. */
let extra = 0;

beforeAll(async () => {
  s = await startTestScheduler({ CANTO_HEARTBEAT_MS: '100', CANTO_ADMIN_TOKEN: ADMIN_TOKEN });
  agent = await startFakeAgent(s.url, {
    meter: (driver) => ({
      read: async () => ({
        running: [...driver.desktops.values()].filter((d) => d.running).length + extra,
        measured: { memory_available_mb: 4096, desktops_memory_mb: 0, cpu_busy: 0 },
      }),
    }),
  });
  sql = connectDatabase(s.databaseUrl, { max: 1 });
});

afterAll(async () => {
  await sql?.end();
  await agent?.stop();
  await s?.close();
});

const unrecordedSince = async () => (await sql<Array<{ unrecorded_since: Date | null }>>`SELECT unrecorded_since FROM hosts WHERE id = ${agent.hostId}`)[0]!.unrecorded_since;

describe('desktops running unrecorded', () => {
  it('are not counted while the records agree, an awake desktop included', async () => {
    const call = api(s.url, await mintKey(s.databaseUrl, 'acme'));
    const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
    expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
    await until(async () => (await sql`SELECT running_desktops FROM hosts WHERE id = ${agent.hostId}`)[0]!.running_desktops === 1, 5_000, 'a beat counting it');
    expect(await unrecordedSince()).toBeNull();
  });

  it('are recorded from the heartbeats, shown, warned of past a minute, and cleared once they agree', async () => {
    extra = 1;
    const since = await until(unrecordedSince, 5_000, 'the mismatch recorded');
    const host = (await (await fetch(`${s.url}/admin/v1/hosts/${agent.hostId}`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } })).json()) as { unrecorded_since: string | null };
    expect(host.unrecorded_since).toBe(since.toISOString());
    // Kept from beat to beat: it says since when, not since the last one.
    await new Promise((r) => setTimeout(r, 300));
    expect((await unrecordedSince())!.getTime()).toBe(since.getTime());
    // Not yet a warning: a template build or a move's commit runs one unrecorded for a moment.
    expect((await readFleetStatus(sql)).warnings).toEqual([]);

    await sql`UPDATE hosts SET unrecorded_since = now() - interval '2 minutes' WHERE id = ${agent.hostId}`;
    expect((await readFleetStatus(sql)).warnings).toEqual([
      expect.stringMatching(new RegExp(`^host ${agent.hostId} \\(.*\\) has run 2 desktop\\(s\\) for 2 min where its records let 1 run: one runs unbilled`)),
    ]);

    extra = 0;
    await until(async () => (await unrecordedSince()) === null, 5_000, 'the mismatch cleared');
    expect((await readFleetStatus(sql)).warnings).toEqual([]);
  });

  it('count an awake desktop an open move brings to the host as one its records let run, in the warning as in the record', async () => {
    const call = api(s.url, await mintKey(s.databaseUrl, 'acme'));
    const moving = (await call('POST', '/v1/desktops', { tier: 'small' })).json as { id: string; org_id: string };
    const [org] = await sql<Array<{ org_id: string }>>`SELECT org_id FROM desktops WHERE id = ${moving.id}`;
    // A move already started on this host, not committed: running, so no engine claims it here.
    await sql`
      INSERT INTO operations (id, org_id, desktop_id, kind, state, from_state, reason, params)
      VALUES ('op_unrecorded_move', ${org!.org_id}, ${moving.id}, 'move', 'running', 'awake', 'admin',
              ${sql.json({ phase: 'started', target_host_id: agent.hostId, was_awake: true })})`;
    try {
      // One awake here by its row, one by the move: a third is one too many.
      extra = 2;
      await until(unrecordedSince, 5_000, 'the mismatch recorded');
      await sql`UPDATE hosts SET unrecorded_since = now() - interval '2 minutes' WHERE id = ${agent.hostId}`;
      expect((await readFleetStatus(sql)).warnings).toEqual([
        expect.stringMatching(new RegExp(`^host ${agent.hostId} \\(.*\\) has run 3 desktop\\(s\\) for 2 min where its records let 2 run: `)),
      ]);
      extra = 1;
      await until(async () => (await unrecordedSince()) === null, 5_000, 'the move counted');
    } finally {
      extra = 0;
      await sql`DELETE FROM operations WHERE id = 'op_unrecorded_move'`;
    }
  });
});
