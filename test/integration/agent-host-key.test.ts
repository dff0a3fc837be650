/**
 * A host id is its first key's (agent/src/host-identity.ts, migration 0012): the join token, which
 * every agent holds, does not let another agent say hello as a host that registered with a key.
 * Such a hello is refused and records nothing; the host's own agent comes back with its key; a
 * host registered by an agent that sent no key records the first key it is sent. Real scheduler
 * and database, fake agents over real websockets, each with a state directory of its own.
 */
import { copyFileSync, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { startTestScheduler, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { FakeDriver } from '../../agent/src/runtime/fake.js';
import { HOST_ID_FILE, HOST_KEY_FILE } from '../../agent/src/host-identity.js';
import { connectDatabase } from '../../scheduler/src/store/db.js';

let s: TestScheduler;
const agents: TestAgent[] = [];
const dirs: string[] = [];

beforeAll(async () => {
  s = await startTestScheduler();
});

afterAll(async () => {
  for (const a of agents) await a.stop().catch(() => undefined);
  await s?.close();
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

async function hostRow(hostId: string) {
  const sql = connectDatabase(s.databaseUrl, { max: 1 });
  try {
    const [row] = await sql<Array<{ host_key_hash: string | null; agent_instance_id: string; hostname: string }>>`
      SELECT host_key_hash, agent_instance_id, hostname FROM hosts WHERE id = ${hostId}`;
    return row!;
  } finally {
    await sql.end();
  }
}

/** An agent on `stateDir` (kept when it stops), as the same host the directory names. */
async function agentOn(stateDir: string, waitConnected = true): Promise<TestAgent> {
  const agent = await startFakeAgent(s.url, { again: { stateDir, driver: new FakeDriver() }, waitConnected });
  agents.push(agent);
  return agent;
}

it("refuses a hello that names a host id with another key, and takes the host's own agent back", async () => {
  const own = await startFakeAgent(s.url);
  agents.push(own);
  const keyFile = join(own.stateDir, HOST_KEY_FILE);
  expect(statSync(keyFile).mode & 0o777).toBe(0o600);
  expect(readFileSync(keyFile, 'utf8')).toMatch(/^[A-Za-z0-9_-]{43}\n$/);
  const registered = await hostRow(own.hostId);
  expect(registered.host_key_hash).toMatch(/^[0-9a-f]{64}$/);
  await own.stop(true);

  // Another machine given the host id (and the join token) but not the key.
  const other = mkdtempSync(join(tmpdir(), 'canto-host-key-'));
  dirs.push(other);
  copyFileSync(join(own.stateDir, HOST_ID_FILE), join(other, HOST_ID_FILE));
  const impostor = await agentOn(other, false);
  expect(impostor.hostId).toBe(own.hostId);
  await expect(impostor.waitConnected(2_000)).rejects.toThrow();
  expect(impostor.connected()).toBe(false);
  expect(await hostRow(own.hostId)).toEqual(registered);
  await impostor.stop(true);

  const back = await agentOn(own.stateDir);
  expect(back.connected()).toBe(true);
  expect((await hostRow(own.hostId)).host_key_hash).toBe(registered.host_key_hash);
}, 30_000);

it('records the first key of a host registered without one', async () => {
  const legacy = await startFakeAgent(s.url);
  agents.push(legacy);
  await legacy.stop(true);
  const sql = connectDatabase(s.databaseUrl, { max: 1 });
  await sql`UPDATE hosts SET host_key_hash = NULL WHERE id = ${legacy.hostId}`;
  await sql.end();
  await agentOn(legacy.stateDir);
  expect((await hostRow(legacy.hostId)).host_key_hash).toMatch(/^[0-9a-f]{64}$/);
}, 30_000);
