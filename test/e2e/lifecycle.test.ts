/**
 * End to end: the real scheduler and the real agent (the `canto` CLI as child processes), the
 * sandbox runtime with Xvfb and CRIU, and a real PostgreSQL. A desktop goes through its whole
 * life, driven the way API clients drive it: through the TypeScript SDK (sdk/), whose lifecycle
 * calls wait for their operations and whose files stream up and down. A test helper also
 * reaches inside the guest through the sandbox driver on the agent's state directory, the way
 * an operator's tooling would, to check what the API cannot see (and while the agent is down).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createHash, randomBytes } from 'node:crypto';
import { closeSync, mkdtempSync, openSync, readlinkSync, rmSync, existsSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import type { ReadableStream as NodeReadableStream } from 'node:stream/web';
import { freshDatabaseUrl } from '../helpers/db.js';
import { mintKey, until } from '../helpers/scheduler.js';
import { freePort, startAgentProcess, startSchedulerProcess, STRAY_CHILD_FD, type Child } from '../helpers/processes.js';
import { cgroupPids } from '../../agent/src/runtime/sandbox/host/cgroups.js';
import { createSandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import type { RuntimeDriver } from '../../agent/src/runtime/driver.js';
import { createCanto, unwrap, type Canto } from '../../sdk/src/index.js';

const isRoot = process.getuid?.() === 0;
const sha = (b: Uint8Array) => createHash('sha256').update(b).digest('hex');

describe.skipIf(!isRoot)('desktop lifecycle, end to end', () => {
  let scheduler: Child & { url: string };
  let agent: Child;
  let stateDir: string;
  let guest: RuntimeDriver;
  let canto: Canto;
  // The agent runs under a supervisor that leaks its log file's descriptor (not close-on-exec).
  let strayPath: string;
  let strayFd: number;

  beforeAll(async () => {
    stateDir = mkdtempSync(join(tmpdir(), 'canto-e2e-'));
    strayPath = join(stateDir, 'supervisor.log');
    strayFd = openSync(strayPath, 'a');
    const databaseUrl = await freshDatabaseUrl();
    scheduler = await startSchedulerProcess({ databaseUrl, port: await freePort() });
    agent = startAgentProcess(scheduler.url, stateDir, {}, strayFd);
    canto = createCanto({ baseUrl: scheduler.url, apiKey: await mintKey(databaseUrl, 'e2e') });
    guest = await createSandboxDriver({ stateDir: join(stateDir, 'runtime') });
  });

  afterAll(async () => {
    await guest?.close();
    await agent?.kill('SIGTERM');
    await scheduler?.kill('SIGTERM');
    if (strayFd !== undefined) closeSync(strayFd);
    // Desktops outlive their agent by design; destroy whatever a failed test left behind.
    if (stateDir && existsSync(join(stateDir, 'runtime'))) {
      const cleaner = await createSandboxDriver({ stateDir: join(stateDir, 'runtime') });
      for (const d of await cleaner.list()) await cleaner.destroy(d.desktopId);
      await cleaner.close();
    }
    if (stateDir) rmSync(stateDir, { recursive: true, force: true });
  });

  it('creates, wakes, survives an agent restart, hibernates with memory, wakes again and destroys a real desktop', async () => {
    const created = await canto.createDesktop({
      tier: 'small',
      env: { GREETING: "it's alive" },
      setup_script: 'echo ran >> /root/setup-runs; echo done',
    });
    const id = created.id;
    const generations: number[] = [created.generation];

    const woke = await canto.wake(id, { wait: true });
    expect(woke.state).toBe('succeeded');
    let desktop = await canto.getDesktop(id);
    expect(desktop.state).toBe('awake');
    expect(desktop.host_id).toMatch(/^host_/);
    generations.push(desktop.generation);

    // What the agent inherited stays with it: no process of the desktop holds a host file it did
    // not open (such a descriptor would also keep CRIU from dumping the desktop's memory).
    expect(readlinkSync(`/proc/${agent.proc.pid}/fd/${STRAY_CHILD_FD}`)).toBe(strayPath);
    const pids = await cgroupPids(id);
    expect(pids.length).toBeGreaterThan(0);
    // A process of the setup script may end (and its descriptors go) while they are read.
    const gone = <T>(read: () => T, none: T): T => {
      try {
        return read();
      } catch {
        return none;
      }
    };
    const held = pids.flatMap((pid) => gone(() => readdirSync(`/proc/${pid}/fd`), []).map((fd) => gone(() => readlinkSync(`/proc/${pid}/fd/${fd}`), '')));
    expect(held).not.toContain(strayPath);

    // First wake: env written, setup script run under process id `setup`.
    const envFile = await guest.exec(id, { command: 'cat /root/.canto/env', timeoutMs: 10_000, maxOutputBytes: 1 << 20 });
    expect(envFile.stdout).toContain('GREETING');
    expect(envFile.stdout).toContain("it'\\''s alive");
    await until(async () => (await guest.exec(id, { command: 'cat /root/.canto/processes/setup/exit_code', timeoutMs: 10_000, maxOutputBytes: 1 << 20 })).stdout.trim() === '0', 10_000, 'setup script to finish');

    // Files on the guest disk (one written by a command, one streamed up through the API), and a
    // process that must survive a memory snapshot.
    expect(await canto.exec(id, 'echo persisted > /root/e2e.txt && cat /root/e2e.txt')).toMatchObject({ exit_code: 0, stdout: 'persisted\n' });
    const blob = randomBytes(2 * 1024 * 1024 + 5);
    await canto.files.upload(id, '/root/blob.bin', Readable.from([blob.subarray(0, 1000), blob.subarray(1000)]));
    const downloaded = async () => {
      const { body } = await canto.files.download(id, '/root/blob.bin');
      const hash = createHash('sha256');
      for await (const chunk of Readable.fromWeb(body as NodeReadableStream<Uint8Array>)) hash.update(chunk as Buffer);
      return hash.digest('hex');
    };
    expect(await downloaded()).toBe(sha(blob));
    expect((await canto.exec(id, 'sha256sum /root/blob.bin')).stdout.split(' ')[0]).toBe(sha(blob));
    const started = await guest.exec(id, { command: 'setsid sleep 100000 >/dev/null 2>&1 < /dev/null & echo $!', timeoutMs: 10_000, maxOutputBytes: 1 << 20 });
    const sleeperPid = started.stdout.trim();
    expect(sleeperPid).toMatch(/^\d+$/);

    // Desktops outlive their agent: restart it; the desktop keeps running and stays drivable.
    await agent.kill('SIGTERM');
    expect((await guest.exec(id, { command: `kill -0 ${sleeperPid} && echo up`, timeoutMs: 10_000, maxOutputBytes: 1 << 20 })).stdout).toBe('up\n');
    agent = startAgentProcess(scheduler.url, stateDir, {}, strayFd);

    const hibernated = await canto.hibernate(id, { wait: true });
    desktop = await canto.getDesktop(id);
    expect(desktop.state).toBe('hibernated');
    generations.push(desktop.generation);
    const snapshots = guest.capabilities().memorySnapshots;
    expect(hibernated.result?.snapshot).toBe(snapshots);

    const rewoke = await canto.wake(id, { wait: true });
    expect(rewoke.result?.restored).toBe(snapshots);
    desktop = await canto.getDesktop(id);
    expect(desktop.state).toBe('awake');
    generations.push(desktop.generation);

    expect((await guest.exec(id, { command: 'cat /root/e2e.txt', timeoutMs: 10_000, maxOutputBytes: 1 << 20 })).stdout).toBe('persisted\n');
    expect(await downloaded()).toBe(sha(blob));
    if (snapshots) {
      const alive = await guest.exec(id, { command: `kill -0 ${sleeperPid} && cat /proc/${sleeperPid}/cmdline | tr '\\0' ' '`, timeoutMs: 10_000, maxOutputBytes: 1 << 20 });
      expect(alive.exitCode).toBe(0);
      expect(alive.stdout).toContain('sleep 100000');
    }
    // The setup script ran exactly once, not again on the second wake.
    expect((await guest.exec(id, { command: 'cat /root/setup-runs', timeoutMs: 10_000, maxOutputBytes: 1 << 20 })).stdout).toBe('ran\n');

    const usage = unwrap(await canto.api.GET('/v1/usage'));
    const line = usage.per_desktop.find((l) => l.desktop_id === id)!;
    expect(line.awake_seconds).toBeGreaterThan(0);
    expect(line.weighted_awake_seconds).toBeCloseTo(line.awake_seconds * 0.5, 6);

    expect((await canto.destroy(id, { wait: true })).state).toBe('succeeded');
    desktop = await canto.getDesktop(id);
    expect(desktop.state).toBe('destroyed');
    generations.push(desktop.generation);
    for (let i = 1; i < generations.length; i++) expect(generations[i]).toBeGreaterThan(generations[i - 1]!);

    expect((await guest.list()).map((d) => d.desktopId)).not.toContain(id);
    // The destroy answered once the files were out of the desktops directory; they are removed behind it.
    const leftovers = () => (existsSync(join(stateDir, 'runtime')) ? JSON.stringify(readdirSync(join(stateDir, 'runtime'), { recursive: true })) : '');
    expect(readdirSync(join(stateDir, 'runtime', 'desktops'))).not.toContain(id);
    await until(() => !leftovers().includes(id), 10_000, 'the destroyed desktop\'s files to be removed');
  });
});
