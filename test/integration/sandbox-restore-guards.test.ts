/**
 * What a restore leaves behind, and what it refuses. A memory snapshot whose guest lacks the cover
 * of a secret directory in /etc (dumped before the covers existed, or on a host without that
 * directory) is not restored: the desktop boots cold, with every cover this host requires, and
 * the runtime warns why; its disk is kept, its programs end. (A secret file needs no cover of its
 * own where the guests' view of /etc hides it: sandbox-etc-covers.test.ts.) Spent images an agent stopped before removing
 * (between a restore and their removal) are removed when the running guest is next adopted, so
 * the next hibernate keeps its own memory, not those images. A dump that ended after its agent
 * stopped (CRIU goes on in a process group of its own) is kept by the next hibernate or start, and
 * a guest a restore brought back after its agent stopped is adopted, not restored a second time;
 * spent images still there at a hibernate give way to its new ones;
 * a hibernate waits for a dump such an agent left running rather than dumping under it, and a start
 * waits for it rather than adopting a guest that dump is about to end.
 */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { existsSync } from 'node:fs';
import { cp, mkdtemp, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import { detectCriu, dump } from '../../agent/src/runtime/sandbox/host/criu.js';
import { maskedHostPaths } from '../../agent/src/runtime/sandbox/guest/guest-init.js';
import { desktopPaths } from '../../agent/src/runtime/sandbox/host/layout.js';
import type { InitProcess } from '../../agent/src/runtime/sandbox/host/cold-boot.js';
import { createSandboxDriver, type SandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { destroyLeftDesktops, isRoot } from '../helpers/sandbox.js';
import { until } from '../helpers/wait.js';

const criu = isRoot ? await detectCriu(undefined) : null;

describe.skipIf(criu === null)('restores after an interruption, and restores refused', () => {
  const logged: string[] = [];
  let base: string;
  let driver: SandboxDriver;
  const dirOf = (id: string) => join(base, 'state', 'desktops', id);

  beforeAll(async () => {
    base = await mkdtemp(join(tmpdir(), 'canto-restore-guards-'));
    const log = (msg: string, fields?: object, level?: 'warn') => void logged.push(`${level ?? 'info'}: ${msg} ${JSON.stringify(fields ?? {})}`);
    driver = await createSandboxDriver({ stateDir: join(base, 'state'), log, goldenTemplates: false });
  });

  afterAll(async () => {
    await driver?.close();
    await destroyLeftDesktops(join(base, 'state'));
    await rm(base, { recursive: true, force: true });
  });

  /** A new desktop, started. */
  const started = async () => {
    const id = newId('desktop');
    await driver.prepare(id, 'small');
    await driver.start({ desktopId: id, tier: 'small', firstBoot: null });
    return id;
  };

  it('boots cold, covered, instead of restoring a snapshot without the cover of a secret directory', async () => {
    const [secretDir] = maskedHostPaths().dirs;
    expect(secretDir).toBeDefined();
    const id = await started();
    await driver.exec(id, { command: 'echo kept > /root/note', timeoutMs: 10_000, maxOutputBytes: 100 });
    expect(await driver.hibernate(id)).toEqual({ snapshot: true });
    // What an image dumped before that directory was covered says of its mounts.
    const externalsFile = join(dirOf(id), 'snapshot', 'externals.json');
    const externals = JSON.parse(await readFile(externalsFile, 'utf8')) as Array<{ guestPath: string }>;
    expect(externals.map((e) => e.guestPath)).toEqual(expect.arrayContaining([...maskedHostPaths().files, secretDir]));
    await writeFile(externalsFile, JSON.stringify(externals.filter((e) => e.guestPath !== secretDir)));

    expect((await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).restored).toBe(false);
    expect(logged.filter((line) => line.startsWith('warn: restore failed; booting cold') && line.includes(secretDir!))).toHaveLength(1);
    const read = await driver.exec(id, { command: `ls -A ${secretDir} | wc -l; cat /root/note`, timeoutMs: 10_000, maxOutputBytes: 1000 });
    expect(read.stdout).toBe('0\nkept\n');
    await driver.destroy(id);
  }, 60_000);

  it('removes spent images left beside a running guest when it adopts it, and the next hibernate keeps the memory of now', async () => {
    const id = await started();
    expect(await driver.hibernate(id)).toEqual({ snapshot: true });
    const snapshot = join(dirOf(id), 'snapshot');
    const spent = join(base, 'spent');
    await cp(snapshot, spent, { recursive: true });
    expect((await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).restored).toBe(true);
    // What an agent stopped right after the restore leaves: the images still in place.
    await cp(spent, snapshot, { recursive: true });
    const counter = await driver.exec(id, { command: 'sleep 1000 >/dev/null 2>&1 & echo $!', timeoutMs: 10_000, maxOutputBytes: 100 });

    // The next agent's start of the running desktop adopts it.
    expect((await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).restored).toBe(false);
    await until(async () => !existsSync(snapshot), 5_000, 'the spent images removed');
    expect(await driver.hibernate(id)).toEqual({ snapshot: true });
    expect((await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).restored).toBe(true);
    // The process started after the restore runs on: the memory is the latest hibernate's.
    const alive = await driver.exec(id, { command: `kill -0 ${counter.stdout.trim()} && echo alive`, timeoutMs: 10_000, maxOutputBytes: 100 });
    expect(alive.stdout).toBe('alive\n');
    await driver.destroy(id);
  }, 60_000);

  it('puts a new dump in place of spent images an agent left beside the guest, not the old memory back', async () => {
    const id = await started();
    expect(await driver.hibernate(id)).toEqual({ snapshot: true });
    const snapshot = join(dirOf(id), 'snapshot');
    const spent = join(base, 'spent-at-hibernate');
    await cp(snapshot, spent, { recursive: true });
    expect((await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).restored).toBe(true);
    // Left by an agent stopped right after the restore, and found by no start since.
    await cp(spent, snapshot, { recursive: true });
    const counter = await driver.exec(id, { command: 'sleep 1000 >/dev/null 2>&1 & echo $!', timeoutMs: 10_000, maxOutputBytes: 100 });
    expect(await driver.hibernate(id), logged.join('\n')).toEqual({ snapshot: true });
    expect((await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).restored).toBe(true);
    // The memory is this hibernate's: the process started after the first restore runs on.
    const alive = await driver.exec(id, { command: `kill -0 ${counter.stdout.trim()} && echo alive`, timeoutMs: 10_000, maxOutputBytes: 100 });
    expect(alive.stdout).toBe('alive\n');

    // An agent killed after CRIU finished and before its rename, with spent images still there:
    // the start keeps the finished dump, the newer memory, over them.
    const later = await driver.exec(id, { command: 'sleep 1001 >/dev/null 2>&1 & echo $!', timeoutMs: 10_000, maxOutputBytes: 100 });
    expect(await driver.hibernate(id)).toEqual({ snapshot: true });
    await rename(snapshot, join(dirOf(id), 'snapshot.tmp'));
    await cp(spent, snapshot, { recursive: true });
    expect((await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).restored).toBe(true);
    const kept = await driver.exec(id, { command: `kill -0 ${later.stdout.trim()} && echo alive`, timeoutMs: 10_000, maxOutputBytes: 100 });
    expect(kept.stdout).toBe('alive\n');
    await driver.destroy(id);
  }, 60_000);

  it('keeps a dump that ended after its agent stopped, adopts a guest restored after it, and keeps no unfinished dump', async () => {
    const id = await started();
    const sleeper = (await driver.exec(id, { command: 'sleep 1000 >/dev/null 2>&1 & echo $!', timeoutMs: 10_000, maxOutputBytes: 100 })).stdout.trim();
    expect(await driver.hibernate(id)).toEqual({ snapshot: true });
    // What an agent killed after CRIU finished but before its rename leaves.
    const dir = dirOf(id);
    await rename(join(dir, 'snapshot'), join(dir, 'snapshot.tmp'));
    expect(await driver.hibernate(id)).toEqual({ snapshot: true });
    expect((await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).restored).toBe(true);
    expect((await driver.exec(id, { command: `kill -0 ${sleeper} && echo alive`, timeoutMs: 10_000, maxOutputBytes: 100 })).stdout).toBe('alive\n');

    // A restore that ended after its agent stopped, before the agent recorded the guest (its
    // images still in place, CRIU's pidfile naming the init): the next start adopts that guest
    // instead of restoring the images again over what it has written since.
    expect(await driver.hibernate(id)).toEqual({ snapshot: true });
    const images = join(base, 'images');
    await cp(join(dir, 'snapshot'), images, { recursive: true });
    expect((await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).restored).toBe(true);
    const init = JSON.parse(await readFile(join(dir, 'run', 'init.json'), 'utf8')) as { pid: number };
    const after = (await driver.exec(id, { command: 'echo written-since > /root/since; sleep 1001 >/dev/null 2>&1 & echo $!', timeoutMs: 10_000, maxOutputBytes: 100 })).stdout.trim();
    await cp(images, join(dir, 'snapshot'), { recursive: true });
    await writeFile(join(dir, 'run', 'restore.pid'), `${init.pid}\n`);
    await rm(join(dir, 'run', 'init.json'));
    expect((await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).restored).toBe(true);
    expect((JSON.parse(await readFile(join(dir, 'run', 'init.json'), 'utf8')) as { pid: number }).pid).toBe(init.pid);
    expect((await driver.exec(id, { command: `kill -0 ${after} && cat /root/since`, timeoutMs: 10_000, maxOutputBytes: 100 })).stdout).toBe('written-since\n');
    expect(existsSync(join(dir, 'snapshot'))).toBe(false);

    // A dump cut short (CRIU writes stats-dump last, on success only) is not kept: the wake is cold.
    expect(await driver.hibernate(id)).toEqual({ snapshot: true });
    await rename(join(dir, 'snapshot'), join(dir, 'snapshot.tmp'));
    await rm(join(dir, 'snapshot.tmp', 'stats-dump'));
    expect(await driver.hibernate(id)).toEqual({ snapshot: false });
    expect((await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).restored).toBe(false);
    expect(existsSync(join(dir, 'snapshot.tmp'))).toBe(false);
    await driver.destroy(id);
  }, 60_000);

  it('waits for a dump another agent process left running, instead of dumping under it', async () => {
    const other = await started();
    const sleeper = (await driver.exec(other, { command: 'sleep 1000 >/dev/null 2>&1 & echo $!', timeoutMs: 10_000, maxOutputBytes: 100 })).stdout.trim();
    const init = JSON.parse(await readFile(join(dirOf(other), 'run', 'init.json'), 'utf8')) as { pid: number };
    // What CRIU holding the guest looks like from outside: its init traced (ptrace, syscall 101 on
    // x86-64, with PTRACE_SEIZE, which does not stop it), until the tracer ends.
    const holder = spawn('perl', ['-e', 'syscall(101, 0x4206, $ARGV[0] + 0, 0, 0) == 0 or die "seize: $!"; $| = 1; print "held\\n"; select(undef, undef, undef, 0.8);', String(init.pid)], { stdio: ['ignore', 'pipe', 'inherit'] });
    await once(holder.stdout!, 'data');
    const t0 = Date.now();
    expect(await driver.hibernate(other)).toEqual({ snapshot: true });
    expect(Date.now() - t0).toBeGreaterThanOrEqual(500);
    expect((await driver.start({ desktopId: other, tier: 'small', firstBoot: null })).restored).toBe(true);
    expect((await driver.exec(other, { command: `kill -0 ${sleeper} && echo alive`, timeoutMs: 10_000, maxOutputBytes: 100 })).stdout).toBe('alive\n');
    await driver.destroy(other);
  }, 60_000);

  it('waits for a dump another agent process left running before it adopts the guest, and wakes from that dump', async () => {
    const other = await started();
    const sleeper = (await driver.exec(other, { command: 'sleep 1000 >/dev/null 2>&1 & echo $!', timeoutMs: 10_000, maxOutputBytes: 100 })).stdout.trim();
    const paths = desktopPaths(join(base, 'state'), other);
    const init = JSON.parse(await readFile(paths.initFile, 'utf8')) as InitProcess;
    // A dump started by an agent process that was then killed: outside this driver and its lock.
    const foreign = dump(criu!, paths, init);
    await until(async () => /^TracerPid:\s+[1-9]/m.test(await readFile(`/proc/${init.pid}/status`, 'utf8').catch(() => '')), 10_000);
    const start = await driver.start({ desktopId: other, tier: 'small', firstBoot: null });
    await foreign;
    expect(start).toEqual({ restored: true });
    expect((await driver.exec(other, { command: `kill -0 ${sleeper} && echo alive`, timeoutMs: 10_000, maxOutputBytes: 100 })).stdout).toBe('alive\n');
    await driver.destroy(other);
  }, 60_000);
});
