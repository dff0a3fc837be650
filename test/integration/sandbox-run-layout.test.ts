/**
 * The guest's `/run` is a directory of `/dev`'s tmpfs behind a symlink (protocol 1.14), so CRIU
 * copies one tmpfs per dump and restore instead of two. Desktops hibernated before that had `/run`
 * as a tmpfs of its own; they must still wake with their memory after the upgrade, hibernate
 * again, and take the new layout at their next cold boot. The earlier layout is booted here by a
 * bwrap wrapper that turns the new arguments back into the old ones.
 */
import { execFileSync } from 'node:child_process';
import { chmod, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import { desktopPaths } from '../../agent/src/runtime/sandbox/host/layout.js';
import { createSandboxDriver, type SandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { destroyLeftDesktops, memorySnapshotsHere } from '../helpers/sandbox.js';

const snapshots = await memorySnapshotsHere();

describe.skipIf(!snapshots)("the guest's /run across the layout change", () => {
  const id = newId('desktop');
  let base: string;
  let state: string;
  let driver: SandboxDriver;

  /** A driver whose bwrap, found on PATH when the driver starts, is `bwrapDir`'s (or the real one). */
  async function driverWith(bwrapDir: string | null): Promise<SandboxDriver> {
    const path = process.env.PATH;
    if (bwrapDir !== null) process.env.PATH = `${bwrapDir}:${path}`;
    try {
      return await createSandboxDriver({ stateDir: state });
    } finally {
      process.env.PATH = path;
    }
  }

  const sh = async (command: string) => {
    const out = await driver.exec(id, { command, timeoutMs: 10_000, maxOutputBytes: 4096 });
    expect(out.exitCode, out.stderr).toBe(0);
    return out.stdout.trim();
  };
  /** What `/run` is in the guest: its file type, and the filesystem mounted there, if any. */
  const runLayout = () => sh(`stat -c %F /run; awk '$5 == "/run" { print $9 }' /proc/self/mountinfo`);
  const tmpfsImages = async () => (await readdir(desktopPaths(state, id).snapshot)).filter((f) => f.startsWith('tmpfs-')).length;

  beforeAll(async () => {
    base = await mkdtemp(join(tmpdir(), 'canto-run-layout-'));
    state = join(base, 'state');
    const bwrap = execFileSync('sh', ['-c', 'command -v bwrap']).toString().trim();
    await writeFile(join(base, 'bwrap'), [
      '#!/bin/bash',
      '# The layout before protocol 1.14: /run a tmpfs of its own, the framebuffer mounted in it.',
      'args=()',
      'while [ $# -gt 0 ]; do',
      '  if [ "$1" = --symlink ] && [ "$2" = /dev/run ] && [ "$3" = /run ]; then shift 3; continue; fi',
      '  if [ "$1" = --dir ] && [ "$2" = /dev/run ]; then args+=(--tmpfs /run); shift 2; continue; fi',
      '  if [ "$1" = /dev/run/canto-fb ]; then args+=(/run/canto-fb); shift; continue; fi',
      '  args+=("$1"); shift',
      'done',
      `exec ${bwrap} "\${args[@]}"`,
      '',
    ].join('\n'));
    await chmod(join(base, 'bwrap'), 0o755);
    driver = await driverWith(base);
  });

  afterAll(async () => {
    await driver?.close();
    await destroyLeftDesktops(state);
    await rm(base, { recursive: true, force: true });
  });

  it('wakes a desktop of the earlier layout with its memory, and moves it to the new one at its next cold boot', async () => {
    await driver.prepare(id, 'small');
    await driver.start({ desktopId: id, tier: 'small', firstBoot: null });
    expect(await runLayout()).toBe('directory\ntmpfs');
    const pid = await sh('echo kept > /run/canto/marker; sleep 1000 >/dev/null 2>&1 & echo $!');
    expect(await driver.hibernate(id)).toEqual({ snapshot: true });
    expect(await tmpfsImages()).toBe(2);

    // The upgrade: an agent that boots the new layout wakes the old image, memory and all.
    await driver.close();
    driver = await driverWith(null);
    expect((await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).restored).toBe(true);
    expect(await runLayout()).toBe('directory\ntmpfs');
    expect(await sh(`kill -0 ${pid} && cat /run/canto/marker && test -s /run/canto-fb/Xvfb_screen0 && echo fb`)).toBe('kept\nfb');
    // It hibernates and wakes again in its own layout.
    expect(await driver.hibernate(id)).toEqual({ snapshot: true });
    expect((await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).restored).toBe(true);
    expect(await sh(`kill -0 ${pid} && cat /run/canto/marker`)).toBe('kept');

    // A cold boot takes the new layout: /run names /dev/run, and the dump copies one tmpfs.
    expect(await driver.hibernate(id)).toEqual({ snapshot: true });
    await rm(desktopPaths(state, id).snapshot, { recursive: true });
    expect((await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).restored).toBe(false);
    expect(await runLayout()).toBe('symbolic link');
    expect(await sh('readlink /run; test -d /run/canto && test -s /run/canto-fb/Xvfb_screen0 && echo fb')).toBe('/dev/run\nfb');
    const next = await sh('echo new > /run/canto/marker; sleep 1000 >/dev/null 2>&1 & echo $!');
    expect(await driver.hibernate(id)).toEqual({ snapshot: true });
    expect(await tmpfsImages()).toBe(1);
    expect((await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).restored).toBe(true);
    expect(await sh(`kill -0 ${next} && cat /run/canto/marker`)).toBe('new');
  });
});
