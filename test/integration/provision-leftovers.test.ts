/**
 * A provision whose disk was made on a host but whose placement was not recorded (its write
 * failed on a passing database fault) is tried again, and may land on another host: the disk the
 * first try left is removed once the desktop is placed elsewhere, without waiting for that host's
 * next hello (a host that stays linked would keep it for good). A retry on the same host keeps
 * its disk (preparing is idempotent). Real scheduler and database, fake agents over websockets.
 */
import { afterAll, afterEach, beforeAll, expect, it } from 'vitest';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { api, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { clearDesktopsFault, failDesktopsOnce } from '../helpers/db-faults.js';

let s: TestScheduler;
let sql: Sql;
let call: ReturnType<typeof api>;
const agents: TestAgent[] = [];

beforeAll(async () => {
  s = await startTestScheduler({ CANTO_HEARTBEAT_MS: '200' });
  sql = connectDatabase(s.databaseUrl, { max: 2 });
  call = api(s.url, await mintKey(s.databaseUrl, 'provision-leftovers'));
  for (let i = 0; i < 2; i++) agents.push(await startFakeAgent(s.url, { delayMs: 0 }));
});

afterEach(async () => {
  await clearDesktopsFault(sql);
  await sql`UPDATE hosts SET cordoned = false`;
});

afterAll(async () => {
  if (sql) {
    await clearDesktopsFault(sql);
    await sql.end();
  }
  for (const agent of agents) await agent.stop();
  await s?.close();
});

/** The first recorded placement fails, with a fault the server means to be passing. */
const failFirstPlacement = () => failDesktopsOnce(sql, '40001', 'UPDATE', 'OLD.host_id IS NULL AND NEW.host_id IS NOT NULL');

/** Cordons whichever host prepares a disk first, as it prepares it: the retry must go elsewhere. */
function cordonFirstPreparer(): { readonly host: () => TestAgent | null } {
  let first: TestAgent | null = null;
  for (const agent of agents) {
    const driver = agent.driver!;
    const prepare = driver.prepare.bind(driver);
    driver.prepare = async (desktopId, tier) => {
      if (first === null) {
        first = agent;
        await sql`UPDATE hosts SET cordoned = true WHERE id = ${agent.hostId}`;
      }
      return prepare(desktopId, tier);
    };
  }
  return { host: () => first };
}

it('removes the disk a failed placement left once the desktop is placed on another host', async () => {
  await failFirstPlacement();
  const preparer = cordonFirstPreparer();
  const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
  const placed = await until(async () => {
    const d = (await call('GET', `/v1/desktops/${id}`)).json;
    return d.state === 'hibernated' ? d : null;
  }, 15_000, 'the desktop to be placed');
  const first = preparer.host()!;
  expect(placed.host_id).not.toBe(first.hostId);
  const other = agents.find((a) => a !== first)!;
  expect(other.driver!.desktops.has(id)).toBe(true);
  // No hello happens meanwhile: the leader removes it on its own.
  await until(() => !first.driver!.desktops.has(id), 5_000, 'the leftover disk to be removed');
  expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
}, 30_000);

it('keeps the disk when the retry places the desktop on the same host', async () => {
  await failFirstPlacement();
  const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
  const placed = await until(async () => {
    const d = (await call('GET', `/v1/desktops/${id}`)).json;
    return d.state === 'hibernated' ? d : null;
  }, 15_000, 'the desktop to be placed');
  const host = agents.find((a) => a.hostId === placed.host_id)!;
  await new Promise((resolve) => setTimeout(resolve, 500));
  expect(host.driver!.desktops.has(id)).toBe(true);
  expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
}, 30_000);
