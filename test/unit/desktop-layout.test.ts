/**
 * Upkeep of a desktop's directory (host/layout.ts). The restore skeleton's `/run`
 * (`ensureSkeletonRun`): a symlink to `/dev/run` for images of protocol 1.14 on, the directory a
 * tmpfs is mounted on for older images, switched either way between restores, and never a
 * directory that holds anything. A restored snapshot (`retireSnapshot`): out of the way at once,
 * removed afterwards with any an earlier agent left.
 */
import { rmSync } from 'node:fs';
import { lstat, mkdir, mkdtemp, readdir, readlink, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { desktopPaths, ensureSkeletonRun, GUEST_RUN_DIR, retireSnapshot } from '../../agent/src/runtime/sandbox/host/layout.js';
import { until } from '../helpers/wait.js';

let root: string;
const run = () => join(root, 'run');

beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), 'canto-skeleton-'));
});

afterEach(async () => {
  await rm(root, { recursive: true, force: true });
});

describe('ensureSkeletonRun', () => {
  it('makes /run a symlink to /dev/run for a current image, from nothing or from the earlier directory', async () => {
    await ensureSkeletonRun(root, false);
    expect(await readlink(run())).toBe(GUEST_RUN_DIR);
    await ensureSkeletonRun(root, false);
    expect(await readlink(run())).toBe(GUEST_RUN_DIR);
    await rm(run());
    await mkdir(run());
    await ensureSkeletonRun(root, false);
    expect(await readlink(run())).toBe('/dev/run');
  });

  it('makes /run a directory for an image whose /run was a tmpfs of its own, from nothing or from the symlink', async () => {
    await ensureSkeletonRun(root, true);
    expect((await lstat(run())).isDirectory()).toBe(true);
    await ensureSkeletonRun(root, true);
    await rm(run(), { recursive: true });
    await ensureSkeletonRun(root, false);
    await ensureSkeletonRun(root, true);
    expect((await lstat(run())).isDirectory()).toBe(true);
  });

  it('refuses to replace a directory that holds anything', async () => {
    await mkdir(run());
    await writeFile(join(run(), 'kept'), 'x');
    await expect(ensureSkeletonRun(root, false)).rejects.toMatchObject({ code: 'ENOTEMPTY' });
    expect((await lstat(join(run(), 'kept'))).isFile()).toBe(true);
  });
});

describe('retireSnapshot', () => {
  it('renames the snapshot away at once and then removes it, and what an earlier agent left', async () => {
    const paths = desktopPaths(root, 'dsk_retire000000000000000000');
    await mkdir(paths.snapshot, { recursive: true });
    for (let i = 0; i < 50; i++) await writeFile(join(paths.snapshot, `pages-${i}.img`), 'x');
    await mkdir(join(paths.dir, 'snapshot.spent-1-abcdef'));
    await writeFile(join(paths.dir, 'snapshot.spent-1-abcdef', 'core-1.img'), 'x');
    await mkdir(join(paths.dir, 'snapshot.failed-1'));
    const failures: unknown[] = [];
    await retireSnapshot(paths, (err) => failures.push(err));
    const names = await readdir(paths.dir);
    expect(names).not.toContain('snapshot');
    expect(names.filter((n) => n.startsWith('snapshot.spent-'))).toHaveLength(2);
    await until(async () => !(await readdir(paths.dir)).some((n) => n.startsWith('snapshot.spent-')), 5_000, 'the spent snapshots to go');
    // Images set aside after a failed restore are the operator's, not this removal's.
    expect(await readdir(paths.dir)).toEqual(['snapshot.failed-1']);
    expect(failures).toEqual([]);
  });

  it('finds nothing to do when a destroy removed the directory first', async () => {
    const paths = desktopPaths(root, 'dsk_retiregone00000000000000');
    await mkdir(paths.snapshot, { recursive: true });
    const failures: unknown[] = [];
    await retireSnapshot(paths, (err) => failures.push(err));
    // In the same turn, before the removal's turn comes.
    rmSync(paths.dir, { recursive: true });
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(failures).toEqual([]);
  });
});
