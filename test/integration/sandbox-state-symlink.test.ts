/**
 * A sandbox driver whose state directory is reached through a symlink (a data disk linked into
 * place) works on the real path (agent/src/runtime/sandbox/sandbox-driver.ts): a forked desktop's
 * overlay is found mounted again at its next start, not mounted once more on top of itself at
 * every wake, as it was while the driver compared the symlinked path with the kernel's mount
 * table. Needs root.
 */
import { mkdir, mkdtemp, readFile, rm, symlink } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import { createSandboxDriver, type SandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { destroyLeftDesktops, isRoot } from '../helpers/sandbox.js';

describe.skipIf(!isRoot)('a state directory reached through a symlink', () => {
  let base: string;
  let driver: SandboxDriver;

  beforeAll(async () => {
    base = await mkdtemp(join(tmpdir(), 'canto-state-symlink-'));
    await mkdir(join(base, 'real'));
    await symlink(join(base, 'real'), join(base, 'linked'));
    driver = await createSandboxDriver({ stateDir: join(base, 'linked'), goldenTemplates: false });
  });

  afterAll(async () => {
    await driver?.close();
    await destroyLeftDesktops(join(base, 'real'));
    await rm(base, { recursive: true, force: true });
  });

  it('mounts a forked desktop once however often it wakes', async () => {
    const id = newId('desktop');
    await driver.prepare(id, 'small');
    await driver.start({ desktopId: id, tier: 'small', firstBoot: null });
    await driver.hibernate(id);
    await driver.fork(id, [newId('desktop')]);
    for (let i = 0; i < 3; i++) {
      await driver.start({ desktopId: id, tier: 'small', firstBoot: null });
      await driver.hibernate(id);
    }
    const disk = join(base, 'real', 'desktops', id, 'disk');
    const mounts = (await readFile('/proc/self/mountinfo', 'utf8')).split('\n').filter((l) => l.split(' ')[4] === disk);
    expect(mounts).toHaveLength(1);
    await driver.destroy(id);
  }, 60_000);
});
