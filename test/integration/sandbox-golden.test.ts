/**
 * Golden templates (agent/src/runtime/sandbox/host/golden.ts) on the real sandbox driver and CRIU:
 * new desktops are clones of one pre-booted template, their first wake a restore. Held against a
 * first boot on a driver without templates: the same env file, setup-script effects, hostname,
 * display size and session; clones share no writable state with each other or the template; a
 * clone whose restore fails boots cold and the template is built again. Needs root and CRIU.
 */
import { mkdtemp, readdir, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import type { FirstBootSpec } from '../../agent/src/runtime/driver.js';
import { hostnameFor } from '../../agent/src/runtime/sandbox/guest/guest-init.js';
import { templateIds } from '../../agent/src/runtime/sandbox/host/golden.js';
import { desktopPaths } from '../../agent/src/runtime/sandbox/host/layout.js';
import { createSandboxDriver, type SandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { destroyLeftDesktops, isRoot, memorySnapshotsHere } from '../helpers/sandbox.js';
import { until } from '../helpers/scheduler.js';

const snapshots = isRoot && (await memorySnapshotsHere());

const FIRST_BOOT: FirstBootSpec = {
  env: { GREETING: 'hello world', QUOTED: `it's "here"` },
  setupScript: 'echo "$GREETING" > /root/setup-ran; hostname > /root/setup-hostname',
};

describe.skipIf(!snapshots)('golden templates', () => {
  let base: string;
  let golden: SandboxDriver;
  let plain: SandboxDriver;
  const goldenDir = () => join(base, 'golden');

  beforeAll(async () => {
    base = await mkdtemp(join(tmpdir(), 'canto-golden-'));
    golden = await createSandboxDriver({ stateDir: goldenDir(), goldenTemplates: true });
    plain = await createSandboxDriver({ stateDir: join(base, 'plain') });
    // Built when the driver starts; a creation before it is ready boots cold instead of waiting,
    // and the metrics say both (observability.ts).
    expect(golden.templates()).toEqual({ state: 'building', cloned: 0, empty: 0 });
    const early = newId('desktop');
    await golden.prepare(early, 'small');
    expect(golden.templates()).toEqual({ state: 'building', cloned: 0, empty: 1 });
    await golden.destroy(early);
    expect(await golden.templateReady()).toBe(true);
    expect(golden.templates()).toEqual({ state: 'ready', cloned: 0, empty: 1 });
    expect(plain.templates()).toBeNull();
  });
  afterAll(async () => {
    await golden?.close();
    await plain?.close();
    await destroyLeftDesktops(goldenDir());
    await destroyLeftDesktops(join(base, 'plain'));
    await rm(base, { recursive: true, force: true });
  });

  const sh = async (driver: SandboxDriver, id: string, command: string) => {
    const out = await driver.exec(id, { command, timeoutMs: 10_000, maxOutputBytes: 1 << 20 });
    expect(out.exitCode, `${command}: ${out.stderr}`).toBe(0);
    return out.stdout.trim();
  };
  async function create(driver: SandboxDriver): Promise<{ id: string; restored: boolean }> {
    const id = newId('desktop');
    await driver.prepare(id, 'small');
    const { restored } = await driver.start({ desktopId: id, tier: 'small', firstBoot: FIRST_BOOT });
    await until(async () => (await driver.processStatus(id, 'setup', 10))?.status === 'exited', 10_000, 'the setup script');
    return { id, restored };
  }
  /** What a first boot leaves a desktop with, as its own user sees it. */
  async function firstBootView(driver: SandboxDriver, id: string) {
    return {
      env: await sh(driver, id, 'cat /root/.canto/env'),
      greeting: await sh(driver, id, '. /root/.canto/env; echo "$GREETING / $QUOTED"'),
      setup: await sh(driver, id, 'cat /root/setup-ran'),
      setupHostname: (await sh(driver, id, 'cat /root/setup-hostname')) === hostnameFor(id),
      hostname: (await sh(driver, id, 'hostname')) === hostnameFor(id),
      display: await sh(driver, id, 'xdotool getdisplaygeometry'),
      session: await sh(driver, id, 'ps -eo comm= | grep -x -e Xvfb -e openbox | sort'),
      root: await sh(driver, id, 'ls -A /root'),
    };
  }

  it('makes new desktops from one template, with what a first boot gives them', async () => {
    const cold = await create(plain);
    expect(cold.restored).toBe(false);
    const a = await create(golden);
    const b = await create(golden);
    expect([a.restored, b.restored]).toEqual([true, true]);
    expect(golden.templates()).toEqual({ state: 'ready', cloned: 2, empty: 1 });
    // One template, hidden from the desktops the scheduler hears of.
    expect(await templateIds(goldenDir())).toHaveLength(1);
    expect((await golden.list()).map((d) => d.desktopId).sort()).toEqual([a.id, b.id].sort());

    const expected = await firstBootView(plain, cold.id);
    expect(expected).toMatchObject({ greeting: `hello world / it's "here"`, setup: 'hello world', setupHostname: true, hostname: true, display: '1024 768', session: 'Xvfb\nopenbox' });
    expect(await firstBootView(golden, a.id)).toEqual(expected);
    expect(await firstBootView(golden, b.id)).toEqual(expected);
  });

  it('gives clones nothing writable in common, with each other or with the template', async () => {
    const [a, b] = (await golden.list()).map((d) => d.desktopId) as [string, string];
    for (const [dir, file] of [['/root', 'mine'], ['/tmp', 'mine'], ['/home', 'mine'], ['/var/log', 'mine'], ['/dev/shm', 'mine'], ['/run', 'mine']]) {
      await sh(golden, a, `echo a > ${dir}/${file}`);
      expect(await sh(golden, b, `cat ${dir}/${file} 2>/dev/null || echo absent`)).toBe('absent');
    }
    // Their files, framebuffers and writable layers are their own; the template's layer holds
    // nothing either wrote.
    const [template] = await templateIds(goldenDir());
    const fbOf = (id: string) => join(desktopPaths(goldenDir(), id).fb, 'Xvfb_screen0');
    const inodes = await Promise.all([a, b, template!].map(async (id) => (await stat(fbOf(id))).ino));
    expect(new Set(inodes).size).toBe(3);
    const layers = await readdir(join(goldenDir(), 'layers'));
    for (const layer of layers) expect(await readdir(join(goldenDir(), 'layers', layer, 'root')).catch(() => [])).not.toContain('mine');
    // Their processes are their own: ending b's session leaves a's.
    await golden.destroy(b);
    expect(await sh(golden, a, 'ps -eo comm= | grep -c -x Xvfb')).toBe('1');
    await golden.hibernate(a);
    expect(await golden.start({ desktopId: a, tier: 'small', firstBoot: FIRST_BOOT })).toEqual({ restored: true });
    expect(await sh(golden, a, 'cat /root/mine')).toBe('a');
  });

  it('boots a clone cold when its restore fails, and builds the template again for the next', async () => {
    const [template] = await templateIds(goldenDir());
    // Every clone made from now on lacks its process tree's image.
    await rm(join(desktopPaths(goldenDir(), template!).snapshot, 'pstree.img'));
    const restores = golden.restores();
    const broken = await create(golden);
    expect(broken.restored).toBe(false);
    expect(golden.restores()).toEqual({ restored: restores.restored, failed: restores.failed + 1 });
    const view = await firstBootView(golden, broken.id);
    expect(view).toMatchObject({ setup: 'hello world', hostname: true, display: '1024 768', session: 'Xvfb\nopenbox' });
    expect(await templateIds(goldenDir())).not.toContain(template);

    // Another is built at once, for the next creation.
    expect(await golden.templateReady()).toBe(true);
    const next = await create(golden);
    expect(next.restored).toBe(true);
    // The broken clone counts as cloned: its disk was; its restore is what failed.
    expect(golden.templates()).toEqual({ state: 'ready', cloned: 4, empty: 1 });
    const [rebuilt] = await templateIds(goldenDir());
    expect(rebuilt).toBeDefined();
    expect(rebuilt).not.toBe(template);
  });
});
