/**
 * Copy-on-write fork storage of the sandbox driver (agent/src/runtime/sandbox/layers.ts) on the
 * real machine: forks share the frozen layer instead of copying the disk, a repeated fork adds
 * nothing, layers outlive the source and go with their last desktop, no overlay stays mounted
 * after destroy, a freeze interrupted by a crash is completed on the next start, and what an
 * agent stopped in the middle of its destroys left behind is removed when the next one starts.
 * Needs root.
 */
import { ETC_VIEW_DIR } from '../../agent/src/runtime/sandbox/host/etc-view.js';
import { mkdir, mkdtemp, readdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import { AgentFailure } from '../../shared/src/protocol.js';
import { createSandboxDriver, type SandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { discardedDir, discardsSettled } from '../../agent/src/runtime/sandbox/host/discarded.js';
import { until } from '../helpers/wait.js';

const isRoot = process.getuid?.() === 0;

describe.skipIf(!isRoot)('fork layers on the sandbox driver', () => {
  let stateDir: string;
  let driver: SandboxDriver;

  const exec = async (id: string, command: string) => {
    const out = await driver.exec(id, { command, timeoutMs: 10_000, maxOutputBytes: 1 << 20 });
    expect(out.exitCode, out.stderr).toBe(0);
    return out.stdout;
  };
  const layers = async () => (await readdir(join(stateDir, 'layers')).catch(() => [])).sort();
  // The guests' /etc (host/etc-view.ts) is mounted for as long as the driver runs: not a desktop's.
  const mountsUnder = async () => (await readFile('/proc/self/mountinfo', 'utf8')).split('\n').filter((l) => l.includes(stateDir) && !l.includes(`/${ETC_VIEW_DIR}/`));
  const started = async (id: string) => {
    await driver.prepare(id, 'small');
    await driver.start({ desktopId: id, tier: 'small', firstBoot: null });
  };

  beforeAll(async () => {
    stateDir = await mkdtemp(join(tmpdir(), 'canto-fork-layers-'));
    driver = await createSandboxDriver({ stateDir });
  });

  afterAll(async () => {
    for (const d of (await driver?.list()) ?? []) await driver.destroy(d.desktopId);
    await driver?.close();
    if (stateDir) await rm(stateDir, { recursive: true, force: true });
  });

  it('shares one frozen layer between the source and its forks, and removes it with the last of them', async () => {
    const source = newId('desktop');
    await started(source);
    await exec(source, 'head -c 50000000 /dev/urandom > /root/big && echo one > /root/f');
    await driver.hibernate(source);
    await expect(driver.fork(source, [source])).rejects.toMatchObject({ code: 'bad_request' });

    const [a, b] = [newId('desktop'), newId('desktop')];
    await driver.fork(source, [a, b]);
    expect(await layers()).toHaveLength(1);
    // The disk was not copied: the forks' writable layers are empty.
    for (const id of [a, b]) expect(await readdir(join(stateDir, 'desktops', id, 'upper'))).toEqual([]);
    // Repeating the command, or forking again with nothing written since, adds no layer.
    await driver.fork(source, [a, b]);
    const c = newId('desktop');
    await driver.fork(source, [c]);
    expect(await layers()).toHaveLength(1);

    await driver.start({ desktopId: a, tier: 'small', firstBoot: null });
    expect(await exec(a, 'cat /root/f; stat -c %s /root/big')).toBe('one\n50000000\n');
    await exec(a, 'echo two > /root/f');
    await driver.hibernate(a);
    // A fork of a fork stacks a layer of its own on top of the shared one.
    const grandchild = newId('desktop');
    await driver.fork(a, [grandchild]);
    expect(await layers()).toHaveLength(2);

    await driver.destroy(source);
    // Layers are collected behind the destroy's answer; the forks still stand on both.
    await discardsSettled(stateDir);
    expect(await layers()).toHaveLength(2);
    await driver.start({ desktopId: grandchild, tier: 'small', firstBoot: null });
    expect(await exec(grandchild, 'cat /root/f')).toBe('two\n');
    await driver.start({ desktopId: b, tier: 'small', firstBoot: null });
    expect(await exec(b, 'cat /root/f')).toBe('one\n');

    for (const id of [a, b, c, grandchild]) await driver.destroy(id);
    // Their overlays go with their directories, released and removed behind each destroy's
    // answer, and the layers once no overlay uses them.
    await until(async () => (await layers()).length === 0, 10_000, 'the layers to be collected');
    await until(async () => (await mountsUnder()).length === 0 && (await readdir(discardedDir(stateDir))).length === 0, 10_000, 'the destroyed desktops to be released');
  }, 120_000);

  it('refuses to fork a running desktop', async () => {
    const source = newId('desktop');
    await started(source);
    const err = await driver.fork(source, [newId('desktop')]).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AgentFailure);
    expect((err as AgentFailure).code).toBe('runtime_error');
    await driver.destroy(source);
  }, 60_000);

  it('completes a freeze that a crash interrupted before the rename', async () => {
    const source = newId('desktop');
    await started(source);
    await exec(source, 'echo kept > /root/f');
    await driver.hibernate(source);
    // What a crash right after writing the intent leaves behind.
    const layer = newId('layer');
    await writeFile(join(stateDir, 'desktops', source, 'layers.next.json'), JSON.stringify({ lower: [layer] }));
    await driver.start({ desktopId: source, tier: 'small', firstBoot: null });
    expect(await layers()).toEqual([layer]);
    expect(await exec(source, 'cat /root/f')).toBe('kept\n');
    await driver.destroy(source);
    await discardsSettled(stateDir);
    expect(await layers()).toEqual([]);
  }, 60_000);

  it('removes at start what destroys left when their agent stopped before removing it', async () => {
    const source = newId('desktop');
    await started(source);
    await driver.hibernate(source);
    const fork = newId('desktop');
    await driver.fork(source, [fork]);
    expect(await layers()).toHaveLength(1);
    await driver.close();
    // Both destroys answered (their directories renamed into the discarded directory), and the
    // agent stopped before its sweep and collection ran.
    await mkdir(discardedDir(stateDir), { recursive: true });
    for (const id of [source, fork]) await rename(join(stateDir, 'desktops', id), join(discardedDir(stateDir), id));

    driver = await createSandboxDriver({ stateDir });
    await discardsSettled(stateDir);
    expect(await readdir(discardedDir(stateDir))).toEqual([]);
    expect(await layers()).toEqual([]);
  }, 60_000);
});
