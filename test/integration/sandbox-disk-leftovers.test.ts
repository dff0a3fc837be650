/**
 * What a host's disk would keep for good, found in an audit of forks and layers, and now removed:
 * - a fork that failed while being built (`<id>.tmp`, layers.ts `createFork`) is removed at once,
 *   and one an agent stopped while building is discarded at the next driver's start: nothing
 *   lists them, and each held its source's snapshot images and its layers;
 * - of the memory images set aside by failed restores (`snapshot.failed-<ms>`), only the newest
 *   stays: a desktop whose restores keep failing set one more aside, a memory's size, at every wake.
 * Needs root (the driver's start).
 */
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import { createFork } from '../../agent/src/runtime/sandbox/host/layers.js';
import { desktopPaths } from '../../agent/src/runtime/sandbox/host/layout.js';
import { discardsSettled } from '../../agent/src/runtime/sandbox/host/discarded.js';
import { createSandboxDriver, type SandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { destroyLeftDesktops, isRoot } from '../helpers/sandbox.js';
import { until } from '../helpers/wait.js';

describe.skipIf(!isRoot)("leftovers on a host's disk", () => {
  let stateDir: string;
  let driver: SandboxDriver | null = null;

  beforeAll(async () => {
    stateDir = await mkdtemp(join(tmpdir(), 'canto-disk-leftovers-'));
  });

  afterAll(async () => {
    await driver?.close();
    await destroyLeftDesktops(stateDir);
    await rm(stateDir, { recursive: true, force: true });
  });

  it('removes a fork that failed while being built', async () => {
    const source = desktopPaths(stateDir, newId('desktop'));
    const fork = desktopPaths(stateDir, newId('desktop'));
    // Images that cannot be hard-linked (a directory among them): the build fails halfway.
    await mkdir(join(source.snapshot, 'not-a-file'), { recursive: true });
    await expect(createFork(source, fork, { lower: ['lyr_test'] }, [])).rejects.toThrow();
    expect(existsSync(`${fork.dir}.tmp`)).toBe(false);
    expect(existsSync(fork.dir)).toBe(false);
    await rm(source.dir, { recursive: true, force: true });
  });

  it("discards at the driver's start a fork an earlier agent left unfinished, and keeps only the newest images set aside", async () => {
    const unfinished = `${desktopPaths(stateDir, newId('desktop')).dir}.tmp`;
    await mkdir(join(unfinished, 'snapshot'), { recursive: true });
    await writeFile(join(unfinished, 'snapshot', 'pages-1.img'), 'x');
    driver = await createSandboxDriver({ stateDir, memorySnapshots: false, goldenTemplates: false });
    expect(existsSync(unfinished)).toBe(false);

    const id = newId('desktop');
    await driver.prepare(id, 'small');
    const paths = desktopPaths(stateDir, id);
    // Images of a memory this driver cannot restore, and two sets aside by earlier failed restores.
    for (const dir of [paths.snapshot, `${paths.snapshot}.failed-100`, `${paths.snapshot}.failed-200`]) {
      await mkdir(dir, { recursive: true });
      await writeFile(join(dir, 'pages-1.img'), Buffer.alloc(1 << 20));
    }
    expect((await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).restored).toBe(false);
    await discardsSettled(stateDir);
    const aside = (await readdir(paths.dir)).filter((n) => n.startsWith('snapshot.failed-'));
    expect(aside).toHaveLength(1);
    expect(aside[0]).not.toMatch(/-(100|200)$/);
    await until(async () => (await readdir(join(stateDir, 'discarded')).catch(() => [])).length === 0, 10_000, 'the removals');
    await driver.destroy(id);
  }, 60_000);
});
