/**
 * Upkeep of a desktop's directory (host/layout.ts). The restore skeleton's `/run`
 * (`ensureSkeletonRun`): a symlink to `/dev/run` for images of protocol 1.14 on, the directory a
 * tmpfs is mounted on for older images, switched either way between restores, and never a
 * directory that holds anything.
 */
import { lstat, mkdir, mkdtemp, readlink, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { ensureSkeletonRun, GUEST_RUN_DIR } from '../../agent/src/runtime/sandbox/host/layout.js';

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
