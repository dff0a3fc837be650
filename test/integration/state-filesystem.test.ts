/**
 * A state directory that spans filesystems (agent/src/runtime/sandbox/host/state-filesystem.ts):
 * the driver refuses to start on it and names where to mount, and a fork's freeze that cannot
 * rename into the layer store is undone, so the desktop keeps its disk and chain and starts as
 * before instead of failing every start. A tmpfs mounted below the state directory plays the
 * operator's second disk, and a bind mount one of the same filesystem. Needs root (mounts).
 */
import { execFileSync } from 'node:child_process';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import { SandboxDriver } from '../../agent/src/runtime/sandbox/sandbox-driver.js';
import { freeze, readChain, recoverFreeze } from '../../agent/src/runtime/sandbox/host/layers.js';
import { desktopPaths, desktopsDir, exists } from '../../agent/src/runtime/sandbox/host/layout.js';
import { isRoot } from '../helpers/sandbox.js';

describe.skipIf(!isRoot)('a state directory on two filesystems', () => {
  let base = '';
  const mounts: string[] = [];
  const mountTmpfs = async (dir: string) => {
    await mkdir(dir, { recursive: true });
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=16m', 'canto-test-state', dir]);
    mounts.push(dir);
  };
  afterEach(async () => {
    for (const dir of mounts.splice(0).reverse()) execFileSync('umount', ['-l', dir]);
    if (base) await rm(base, { recursive: true, force: true });
  });

  it('keeps the driver from starting, naming the mount to use', async () => {
    base = await mkdtemp(join(tmpdir(), 'canto-state-fs-'));
    await mountTmpfs(desktopsDir(base));
    const started = SandboxDriver.create({ stateDir: base, memorySnapshots: false, log: () => {} });
    await expect(started).rejects.toThrow(`are on different filesystems`);
    await expect(started).rejects.toThrow(`Mount the desktops' disk at ${base} itself`);
  });

  it('keeps the driver from starting on a bind mount below the state directory, the same filesystem', async () => {
    base = await mkdtemp(join(tmpdir(), 'canto-state-fs-'));
    await mkdir(join(base, 'elsewhere'));
    await mkdir(join(base, 'layers'));
    execFileSync('mount', ['--bind', join(base, 'elsewhere'), join(base, 'layers')]);
    mounts.push(join(base, 'layers'));
    await expect(SandboxDriver.create({ stateDir: base, memorySnapshots: false, log: () => {} })).rejects.toThrow(
      `${join(base, 'layers')} is a mount of its own below ${base}`,
    );
  });

  it('undoes a freeze whose layer cannot be renamed into the store', async () => {
    base = await mkdtemp(join(tmpdir(), 'canto-state-fs-'));
    await mountTmpfs(desktopsDir(base));
    const paths = desktopPaths(base, newId('desktop'));
    await mkdir(join(paths.disk, 'root'), { recursive: true });
    await writeFile(join(paths.disk, 'root', 'kept'), 'still here');

    await expect(freeze(base, paths)).rejects.toMatchObject({ code: 'EXDEV' });
    expect(await exists(join(paths.dir, 'layers.next.json'))).toBe(false);
    expect(await readChain(paths)).toBeNull();
    expect(await readFile(join(paths.disk, 'root', 'kept'), 'utf8')).toBe('still here');

    // A half-done freeze left by an agent before this change: the start's recovery undoes it too.
    await writeFile(join(paths.dir, 'layers.next.json'), JSON.stringify({ lower: [newId('layer')] }));
    await recoverFreeze(base, paths);
    expect(await exists(join(paths.dir, 'layers.next.json'))).toBe(false);
    expect(await readChain(paths)).toBeNull();
    expect(await readFile(join(paths.disk, 'root', 'kept'), 'utf8')).toBe('still here');
  });
});
