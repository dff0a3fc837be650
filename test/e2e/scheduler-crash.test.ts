/**
 * Nothing lost, nothing run twice: the scheduler is killed with SIGKILL while a wake is running
 * on the real agent and runtime. A new scheduler process on the same database takes the leader
 * lease once the dead one's expires, re-drives the running operation, and the desktop ends up
 * awake with its setup script run exactly once.
 *
 * To catch the wake mid-flight deterministically, the agent is paused (SIGSTOP) before the wake
 * is requested, so the scheduler's start command sits unanswered while the operation is
 * `running`; the agent resumes after the scheduler is dead.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mkdtempSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { generateSecretKey } from '../../scheduler/src/crypto/secret-box.js';
import { connectDatabase } from '../../scheduler/src/store/db.js';
import { freshDatabaseUrl } from '../helpers/db.js';
import { api, mintKey, until } from '../helpers/scheduler.js';
import { freePort, startAgentProcess, startSchedulerProcess, type Child } from '../helpers/processes.js';
import { createSandboxDriver } from '../../agent/src/runtime/sandbox/index.js';

const isRoot = process.getuid?.() === 0;

describe.skipIf(!isRoot)('scheduler crash during a wake', () => {
  const children: Child[] = [];
  let stateDir: string;

  beforeAll(() => {
    stateDir = mkdtempSync(join(tmpdir(), 'canto-crash-'));
  });

  afterAll(async () => {
    for (const c of children) {
      c.proc.kill('SIGCONT');
      await c.kill('SIGTERM');
    }
    if (existsSync(join(stateDir, 'runtime'))) {
      const cleaner = await createSandboxDriver({ stateDir: join(stateDir, 'runtime') });
      for (const d of await cleaner.list()) await cleaner.destroy(d.desktopId);
      await cleaner.close();
    }
    rmSync(stateDir, { recursive: true, force: true });
  });

  it('settles the operation after a restart and runs the wake once', async () => {
    const databaseUrl = await freshDatabaseUrl();
    const port = await freePort();
    const secretKey = generateSecretKey();
    const first = await startSchedulerProcess({ databaseUrl, port, secretKey, extra: { CANTO_REPLICA_ID: 'first' } });
    children.push(first);
    const agent = startAgentProcess(first.url, stateDir);
    children.push(agent);
    const call = api(first.url, await mintKey(databaseUrl, 'crash'));
    const sql = connectDatabase(databaseUrl, { max: 1 });
    try {
      const created = await call('POST', '/v1/desktops', { tier: 'small', setup_script: 'echo ran >> /root/setup-runs' });
      const id: string = created.json.id;
      await until(async () => (await call('GET', `/v1/desktops/${id}`)).json.state === 'hibernated', 30_000, 'placement');

      agent.proc.kill('SIGSTOP');
      const wake = await call('POST', `/v1/desktops/${id}/wake`);
      expect(wake.status).toBe(202);
      await until(async () => (await call('GET', `/v1/operations/${wake.json.id}`)).json.state === 'running', 10_000, 'the wake to run');

      await first.kill('SIGKILL');
      agent.proc.kill('SIGCONT');

      const second = await startSchedulerProcess({ databaseUrl, port, secretKey, extra: { CANTO_REPLICA_ID: 'second' } });
      children.push(second);
      const op = await until(async () => {
        const r = await call('GET', `/v1/operations/${wake.json.id}`);
        return r.json.state === 'succeeded' || r.json.state === 'failed' ? r.json : null;
      }, 60_000, 'the wake to settle');
      expect(op.state, JSON.stringify(op)).toBe('succeeded');
      expect((await call('GET', `/v1/desktops/${id}`)).json.state).toBe('awake');

      // Exactly one woken event and one open meter interval: the re-drive did not double-apply.
      const events = await sql`SELECT type FROM outbox WHERE desktop_id = ${id} ORDER BY id`;
      expect(events.map((e) => e.type)).toEqual(['desktop.created', 'desktop.woken']);
      const meters = await sql`SELECT count(*)::int AS n FROM meter_intervals WHERE desktop_id = ${id}`;
      expect(meters[0]!.n).toBe(1);

      const guest = await createSandboxDriver({ stateDir: join(stateDir, 'runtime') });
      try {
        await until(async () => (await guest.exec(id, { command: 'cat /root/.canto/processes/setup/exit_code 2>/dev/null', timeoutMs: 10_000, maxOutputBytes: 1 << 20 })).stdout.trim() === '0', 15_000, 'setup to finish');
        expect((await guest.exec(id, { command: 'cat /root/setup-runs', timeoutMs: 10_000, maxOutputBytes: 1 << 20 })).stdout).toBe('ran\n');
      } finally {
        await guest.close();
      }
      const destroyed = await call('POST', `/v1/desktops/${id}/destroy?wait=true`);
      expect(destroyed.status, destroyed.text).toBe(200);
    } finally {
      await sql.end();
    }
  });
});
