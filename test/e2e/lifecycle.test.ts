/**
 * End to end: the real scheduler and the real agent (the `canto` CLI as child processes), the
 * sandbox runtime with Xvfb and CRIU, and a real PostgreSQL. A desktop goes through its whole
 * life; a test helper reaches inside the guest through the sandbox driver on the agent's state
 * directory, the way an operator's tooling would.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mkdtempSync, rmSync, existsSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { freshDatabaseUrl } from '../helpers/db.js';
import { api, mintKey, until } from '../helpers/scheduler.js';
import { freePort, startAgentProcess, startSchedulerProcess, type Child } from '../helpers/processes.js';
import { createSandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import type { RuntimeDriver } from '../../agent/src/runtime/driver.js';

const isRoot = process.getuid?.() === 0;

describe.skipIf(!isRoot)('desktop lifecycle, end to end', () => {
  let scheduler: Child & { url: string };
  let agent: Child;
  let stateDir: string;
  let guest: RuntimeDriver;
  let call: ReturnType<typeof api>;

  beforeAll(async () => {
    stateDir = mkdtempSync(join(tmpdir(), 'canto-e2e-'));
    const databaseUrl = await freshDatabaseUrl();
    scheduler = await startSchedulerProcess({ databaseUrl, port: await freePort() });
    agent = startAgentProcess(scheduler.url, stateDir);
    call = api(scheduler.url, await mintKey(databaseUrl, 'e2e'));
    guest = await createSandboxDriver({ stateDir: join(stateDir, 'runtime') });
  });

  afterAll(async () => {
    await guest?.close();
    await agent?.kill('SIGTERM');
    await scheduler?.kill('SIGTERM');
    // Desktops outlive their agent by design; destroy whatever a failed test left behind.
    if (stateDir && existsSync(join(stateDir, 'runtime'))) {
      const cleaner = await createSandboxDriver({ stateDir: join(stateDir, 'runtime') });
      for (const d of await cleaner.list()) await cleaner.destroy(d.desktopId);
      await cleaner.close();
    }
    if (stateDir) rmSync(stateDir, { recursive: true, force: true });
  });

  it('creates, wakes, survives an agent restart, hibernates with memory, wakes again and destroys a real desktop', async () => {
    const created = await call('POST', '/v1/desktops', {
      tier: 'small',
      env: { GREETING: "it's alive" },
      setup_script: 'echo ran >> /root/setup-runs; echo done',
    });
    expect(created.status).toBe(201);
    const id: string = created.json.id;
    const generations: number[] = [created.json.generation];

    const woke = await call('POST', `/v1/desktops/${id}/wake?wait=true`);
    expect(woke.status, woke.text).toBe(200);
    expect(woke.json.state).toBe('succeeded');
    let desktop = (await call('GET', `/v1/desktops/${id}`)).json;
    expect(desktop.state).toBe('awake');
    expect(desktop.host_id).toMatch(/^host_/);
    generations.push(desktop.generation);

    // First wake: env written, setup script run under process id `setup`.
    const envFile = await guest.exec(id, { command: 'cat /root/.canto/env', timeoutMs: 10_000, maxOutputBytes: 1 << 20 });
    expect(envFile.stdout).toContain('GREETING');
    expect(envFile.stdout).toContain("it'\\''s alive");
    await until(async () => (await guest.exec(id, { command: 'cat /root/.canto/processes/setup/exit_code', timeoutMs: 10_000, maxOutputBytes: 1 << 20 })).stdout.trim() === '0', 10_000, 'setup script to finish');

    // A file on the guest disk, and a process that must survive a memory snapshot.
    await guest.exec(id, { command: 'echo persisted > /root/e2e.txt', timeoutMs: 10_000, maxOutputBytes: 1 << 20 });
    const started = await guest.exec(id, { command: 'setsid sleep 100000 >/dev/null 2>&1 < /dev/null & echo $!', timeoutMs: 10_000, maxOutputBytes: 1 << 20 });
    const sleeperPid = started.stdout.trim();
    expect(sleeperPid).toMatch(/^\d+$/);

    // Desktops outlive their agent: restart it; the desktop keeps running and stays drivable.
    await agent.kill('SIGTERM');
    expect((await guest.exec(id, { command: `kill -0 ${sleeperPid} && echo up`, timeoutMs: 10_000, maxOutputBytes: 1 << 20 })).stdout).toBe('up\n');
    agent = startAgentProcess(scheduler.url, stateDir);

    const hibernated = await call('POST', `/v1/desktops/${id}/hibernate?wait=true`);
    expect(hibernated.status, hibernated.text).toBe(200);
    desktop = (await call('GET', `/v1/desktops/${id}`)).json;
    expect(desktop.state).toBe('hibernated');
    generations.push(desktop.generation);
    const snapshots = guest.capabilities().memorySnapshots;
    expect(hibernated.json.result.snapshot).toBe(snapshots);

    const rewoke = await call('POST', `/v1/desktops/${id}/wake?wait=true`);
    expect(rewoke.status, rewoke.text).toBe(200);
    expect(rewoke.json.result.restored).toBe(snapshots);
    desktop = (await call('GET', `/v1/desktops/${id}`)).json;
    expect(desktop.state).toBe('awake');
    generations.push(desktop.generation);

    expect((await guest.exec(id, { command: 'cat /root/e2e.txt', timeoutMs: 10_000, maxOutputBytes: 1 << 20 })).stdout).toBe('persisted\n');
    if (snapshots) {
      const alive = await guest.exec(id, { command: `kill -0 ${sleeperPid} && cat /proc/${sleeperPid}/cmdline | tr '\\0' ' '`, timeoutMs: 10_000, maxOutputBytes: 1 << 20 });
      expect(alive.exitCode).toBe(0);
      expect(alive.stdout).toContain('sleep 100000');
    }
    // The setup script ran exactly once, not again on the second wake.
    expect((await guest.exec(id, { command: 'cat /root/setup-runs', timeoutMs: 10_000, maxOutputBytes: 1 << 20 })).stdout).toBe('ran\n');

    const usage = await call('GET', '/v1/usage');
    const line = usage.json.per_desktop.find((l: { desktop_id: string }) => l.desktop_id === id);
    expect(line.awake_seconds).toBeGreaterThan(0);
    expect(line.weighted_awake_seconds).toBeCloseTo(line.awake_seconds * 0.5, 6);

    const destroyed = await call('POST', `/v1/desktops/${id}/destroy?wait=true`);
    expect(destroyed.status, destroyed.text).toBe(200);
    desktop = (await call('GET', `/v1/desktops/${id}`)).json;
    expect(desktop.state).toBe('destroyed');
    generations.push(desktop.generation);
    for (let i = 1; i < generations.length; i++) expect(generations[i]).toBeGreaterThan(generations[i - 1]!);

    expect((await guest.list()).map((d) => d.desktopId)).not.toContain(id);
    const leftovers = existsSync(join(stateDir, 'runtime')) ? JSON.stringify(readdirSync(join(stateDir, 'runtime'), { recursive: true })) : '';
    expect(leftovers).not.toContain(id);
  });
});
