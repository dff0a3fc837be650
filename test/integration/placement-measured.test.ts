/**
 * Placement by measured use, end to end: a real scheduler with its default placement settings and
 * an in-process agent on the FakeDriver whose heartbeats report memory figures the test chooses.
 * With little memory in use the host takes more awake desktops than the old nominal cap of 8;
 * once its measure says the next desktop would eat into the reserve, wakes and creates fail with
 * `no_capacity` saying so, although no nominal cap stands in the way; with memory back they go on.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { totalmem } from 'node:os';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import type { HostMeter } from '../../agent/src/host-meter.js';
import { adminApi, api, mintKey, startTestScheduler, TEST_ADMIN_TOKEN, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { expectProblem } from '../helpers/problem.js';

/** The reserve the scheduler keeps by default: 10 % of the memory the agent reports (this machine's). */
const RESERVE_MB = Math.ceil(Math.floor(totalmem() / (1024 * 1024)) / 10);
/** Room for 40 desktops at the default 256 MiB expected each, beyond the reserve. */
const PLENTY_MB = RESERVE_MB + 40 * 256;
/** Less than one more desktop's expected 256 MiB above the reserve. */
const FULL_MB = RESERVE_MB + 100;

let s: TestScheduler;
let agent: TestAgent;
let sql: Sql;
let call: ReturnType<typeof api>;
let availableMb = PLENTY_MB;
let awakeCount = 0;

beforeAll(async () => {
  s = await startTestScheduler({ CANTO_CAPACITY_WAIT_MS: '1000', CANTO_ADMIN_TOKEN: TEST_ADMIN_TOKEN });
  const meter = (driver: { usage(): Promise<{ running: number }> }): HostMeter => ({
    read: async () => ({
      running: (await driver.usage()).running,
      measured: { memory_available_mb: availableMb, desktops_memory_mb: 0, cpu_busy: 0.01 },
    }),
  });
  agent = await startFakeAgent(s.url, { meter });
  sql = connectDatabase(s.databaseUrl, { max: 2 });
  call = api(s.url, await mintKey(s.databaseUrl, 'measured'));
});

afterAll(async () => {
  await agent?.stop();
  await sql?.end();
  await s?.close();
});

/** Sets what the agent reports and waits until the scheduler has recorded it. */
async function report(mb: number): Promise<void> {
  availableMb = mb;
  await until(async () => {
    const [row] = await sql<Array<{ memory_available_mb: number | null }>>`SELECT memory_available_mb FROM hosts WHERE id = ${agent.hostId}`;
    return row?.memory_available_mb === mb;
  }, 10_000, `the host's measure at ${mb} MiB`);
}

async function created(): Promise<string> {
  const res = await call('POST', '/v1/desktops', { tier: 'small' });
  expect(res.status).toBe(201);
  return res.json.id as string;
}

async function operationError(res: { json: any }) {
  expectProblem(res as never, 409);
  return (await call('GET', `/v1/operations/${res.json.operation_id}`)).json.error;
}

describe('placement by measured memory', () => {
  it('takes more awake small desktops than the old nominal caps allowed when measured use is low', async () => {
    await report(PLENTY_MB);
    // The old defaults (8× CPU, 2× memory over the reported capacity) stopped this host here:
    // 8 small desktops (2 vCPUs, 4 GiB each) on a 2-core machine.
    const [host] = await sql<Array<{ vcpus: number; memory_mb: number }>>`SELECT vcpus, memory_mb FROM hosts WHERE id = ${agent.hostId}`;
    const oldCap = Math.min(Math.floor((host!.vcpus * 8) / 2), Math.floor((host!.memory_mb * 2) / 4096));
    awakeCount = oldCap + 4;
    const ids = await Promise.all(Array.from({ length: awakeCount }, created));
    const wakes = await Promise.all(ids.map((id) => call('POST', `/v1/desktops/${id}/wake?wait=true`)));
    expect(wakes.map((w) => w.json.state)).toEqual(ids.map(() => 'succeeded'));
    expect(running()).toBe(awakeCount);
  });

  it('refuses a wake and a create once the measure says the host is full, saying why', async () => {
    const placed = await created();
    await until(async () => (await call('GET', `/v1/desktops/${placed}`)).json.state === 'hibernated', 10_000, 'placed');
    await report(FULL_MB);

    // A desktop placed on the host: its wake is refused there.
    const wake = await call('POST', `/v1/desktops/${placed}/wake?wait=true`);
    expect(await operationError(wake)).toEqual({
      code: 'no_capacity',
      message: "the desktop's host has no memory to wake it now: its measured use and one more desktop would leave less than its 10% reserve free",
    });
    expect((await call('GET', `/v1/desktops/${placed}`)).json.state).toBe('hibernated');

    // A new desktop finds no host to place it on.
    const fresh = await created();
    const freshWake = await call('POST', `/v1/desktops/${fresh}/wake?wait=true`);
    expect(await operationError(freshWake)).toEqual({
      code: 'no_capacity',
      message: 'no host has room for a small desktop: 1 schedulable, 1 short of memory (its measured use and one more desktop would leave less than its 10% reserve free)',
    });

    // Memory back (desktops elsewhere on the machine ended): both wake.
    await report(PLENTY_MB);
    for (const id of [placed, fresh]) expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).json.state).toBe('succeeded');
  });

  it('shows the measure and the room it leaves in the admin API', async () => {
    await report(FULL_MB);
    const shown = await until(async () => {
      const res = await adminApi(s.url)('GET', `/admin/v1/hosts/${agent.hostId}`);
      return res.json.measured?.running_desktops === awakeCount + 2 ? res.json : null;
    }, 10_000, 'the running count measured');
    expect(shown.measured).toMatchObject({ memory_available_mb: FULL_MB, desktops_memory_mb: 0, cpu_busy: 0.01 });
    expect(shown.memory).toEqual({ reserve_mb: RESERVE_MB, room_mb: 100, room_desktops: 0 });
    expect(shown.capacity).toMatchObject({ vcpus: null, memory_mb: null });
  });

  it("keeps the host's measure when its agent links to another replica", async () => {
    await report(FULL_MB);
    // A second replica: the agent hears of it from the first and links to it with a hello of
    // the same agent instance. That hello once wiped the measure until the next heartbeat, and
    // placement meanwhile took the host for as empty as its nominal memory.
    const b = await startTestScheduler({ CANTO_ADMIN_TOKEN: TEST_ADMIN_TOKEN }, s.databaseUrl);
    try {
      await until(async () => (await adminApi(b.url)('GET', `/admin/v1/hosts/${agent.hostId}`)).json.linked === true, 15_000, 'the agent linked to the second replica');
      const [row] = await sql<Array<{ memory_available_mb: number | null }>>`SELECT memory_available_mb FROM hosts WHERE id = ${agent.hostId}`;
      expect(row!.memory_available_mb).toBe(FULL_MB);
    } finally {
      await b.close();
    }
  });
});

function running(): number {
  return [...agent.driver!.desktops.values()].filter((d) => d.running).length;
}
