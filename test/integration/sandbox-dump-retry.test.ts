/**
 * A hibernate whose first CRIU dump fails for a passing cause keeps the desktop's memory: the
 * driver dumps once more before it falls back to a cold stop (which keeps the disk and loses the
 * processes). The real CRIU runs behind a wrapper that fails this desktop's first dump, as dumps
 * under load on two cores now and then failed; what the desktop ran must still run after the wake.
 * A move's stop (`requireSnapshot`) never falls back: the desktop runs on with its programs and
 * the stop fails, so the move goes back.
 */
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import { detectCriu } from '../../agent/src/runtime/sandbox/host/criu.js';
import { createSandboxDriver, type SandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { destroyLeftDesktops, isRoot } from '../helpers/sandbox.js';

const criu = isRoot ? await detectCriu(undefined) : null;

describe.skipIf(criu === null)('a hibernate whose first dump fails', () => {
  const id = newId('desktop');
  /** A desktop every dump of which fails. */
  const failing = newId('desktop');
  /** Another, stopped for a move. */
  const moving = newId('desktop');
  const logged: string[] = [];
  let base: string;
  let driver: SandboxDriver;

  beforeAll(async () => {
    base = await mkdtemp(join(tmpdir(), 'canto-dump-retry-'));
    const wrapper = join(base, 'criu-failing-once');
    const mark = join(base, 'failed-once');
    // Only this desktop's dump (its images go to its snapshot.tmp), and only the first: the
    // driver's own probe dump and every restore are CRIU's.
    await writeFile(wrapper, [
      '#!/bin/sh',
      `if [ "$1" = dump ] && [ ! -e ${mark} ]; then`,
      `  case "$*" in *${id}/snapshot.tmp*) : > ${mark}; echo "Error (test): a passing failure" >&2; exit 1;; esac`,
      'fi',
      `case "$1 $*" in "dump "*${failing}/snapshot.tmp*|"dump "*${moving}/snapshot.tmp*) echo "Error (test): a lasting failure" >&2; exit 1;; esac`,
      `exec ${criu!.path} "$@"`,
      '',
    ].join('\n'));
    await chmod(wrapper, 0o755);
    const log = (msg: string, fields?: object, level?: 'warn') => void logged.push(`${level ?? 'info'}: ${msg} ${JSON.stringify(fields ?? {})}`);
    driver = await createSandboxDriver({ stateDir: join(base, 'state'), criuPath: wrapper, log });
  });

  afterAll(async () => {
    await driver?.close();
    await destroyLeftDesktops(join(base, 'state'));
    await rm(base, { recursive: true, force: true });
  });

  it("dumps once more and keeps the memory: the desktop's processes run on after the wake", async () => {
    expect(driver.capabilities().memorySnapshots).toBe(true);
    await driver.prepare(id, 'small');
    await driver.start({ desktopId: id, tier: 'small', firstBoot: null });
    const started = await driver.exec(id, { command: 'sleep 1000 >/dev/null 2>&1 & echo $!', timeoutMs: 10_000, maxOutputBytes: 100 });
    const pid = started.stdout.trim();
    expect(await driver.hibernate(id), logged.join('\n')).toEqual({ snapshot: true });
    expect(logged.filter((line) => line.startsWith('info: memory snapshot failed; trying once more'))).toHaveLength(1);
    expect((await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).restored).toBe(true);
    const alive = await driver.exec(id, { command: `kill -0 ${pid} && tr '\\0' ' ' < /proc/${pid}/cmdline`, timeoutMs: 10_000, maxOutputBytes: 100 });
    expect(alive.exitCode, alive.stderr).toBe(0);
    expect(alive.stdout).toContain('sleep 1000');
  });

  it('falls back to a cold stop when the dump fails again, and warns that the programs ended', async () => {
    await driver.prepare(failing, 'small');
    await driver.start({ desktopId: failing, tier: 'small', firstBoot: null });
    expect(await driver.hibernate(failing)).toEqual({ snapshot: false });
    const mine = logged.filter((line) => line.includes(failing) && line.includes('memory snapshot failed'));
    expect(mine.map((line) => line.slice(0, line.indexOf(' {')))).toEqual([
      'info: memory snapshot failed; trying once more',
      'warn: memory snapshot failed; cold stop instead: its running programs end',
    ]);
    expect(mine[1]).toContain('criu dump failed (1)');
    expect((await driver.start({ desktopId: failing, tier: 'small', firstBoot: null })).restored).toBe(false);
  });

  it("leaves a desktop running, its programs with it, when a move's stop cannot keep its memory", async () => {
    await driver.prepare(moving, 'small');
    await driver.start({ desktopId: moving, tier: 'small', firstBoot: null });
    const started = await driver.exec(moving, { command: 'sleep 1000 >/dev/null 2>&1 & echo $!', timeoutMs: 10_000, maxOutputBytes: 100 });
    const stopping = driver.hibernate(moving, { keepDetached: true, requireSnapshot: true });
    await expect(stopping).rejects.toMatchObject({ code: 'snapshot_failed', retryable: false });
    const mine = logged.filter((line) => line.includes(moving) && line.includes('memory snapshot failed'));
    expect(mine.map((line) => line.slice(0, line.indexOf(' {')))).toEqual([
      'info: memory snapshot failed; trying once more',
      'warn: memory snapshot failed; the desktop keeps running, as its move needs its memory',
    ]);
    const alive = await driver.exec(moving, { command: `kill -0 ${started.stdout.trim()} && echo alive`, timeoutMs: 10_000, maxOutputBytes: 100 });
    expect(alive.stdout).toBe('alive\n');
    // A plain hibernate still stops it (cold: its memory cannot be kept).
    expect(await driver.hibernate(moving)).toEqual({ snapshot: false });
    // Counted for the agent's metrics (canto_agent_hibernates_total): this file's three desktops.
    expect(driver.hibernates()).toEqual({ memory: 1, cold: 2, refused: 1 });
  });
});
