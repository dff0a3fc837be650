/**
 * Staging no move will come back for (agent/src/transfer/staging-sweep.ts), on the fake runtime's
 * staging: a directory untouched past the age goes, in its desktop's queue; one written since, or
 * one whose queue held an import, stays; nothing else under the staging root is touched; on the
 * sandbox runtime the layers only the staging stood on go with it.
 */
import { mkdirSync, mkdtempSync, readdirSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { FakeDriver } from '../../agent/src/runtime/fake.js';
import { DesktopQueue } from '../../agent/src/desktop-queue.js';
import { STAGING_MAX_AGE_MS, sweepStaging } from '../../agent/src/transfer/staging-sweep.js';
import type { DesktopTransfer } from '../../agent/src/runtime/transfer.js';
import { SandboxTransfer } from '../../agent/src/runtime/sandbox/host/sandbox-transfer.js';
import { KeyedMutex } from '../../agent/src/runtime/sandbox/host/keyed-mutex.js';
import { layersDir, stagedChainFile } from '../../agent/src/runtime/sandbox/host/layers.js';

const OLD = 'dsk_' + 'a'.repeat(24);
const FRESH = 'dsk_' + 'b'.repeat(24);
const BUSY = 'dsk_' + 'c'.repeat(24);

describe('the staging sweep', () => {
  let root: string;
  let driver: FakeDriver;
  let transfer: DesktopTransfer;
  const queue = new DesktopQueue();
  const logged: string[] = [];

  /** A staging directory with a spool and an unpacked file, last written `ageMs` ago. */
  const stage = (id: string, ageMs: number) => {
    const dir = join(root, id);
    mkdirSync(join(dir, 'x'), { recursive: true });
    writeFileSync(join(dir, 'desktop.part'), 'spooled');
    writeFileSync(join(dir, 'x', 'desktop'), 'unpacked');
    const at = (Date.now() - ageMs) / 1000;
    for (const path of [join(dir, 'x', 'desktop'), join(dir, 'x'), join(dir, 'desktop.part'), dir]) utimesSync(path, at, at);
  };

  beforeEach(() => {
    root = mkdtempSync(join(tmpdir(), 'canto-staging-'));
    driver = new FakeDriver({ stagingDir: root });
    transfer = driver.transfer!;
    logged.length = 0;
  });
  afterEach(async () => {
    await driver.close();
    rmSync(root, { recursive: true, force: true });
  });

  const sweep = () => sweepStaging({ transfer, queued: (id, work) => queue.run(id, work), log: (msg) => void logged.push(msg) });

  it('removes staging untouched past the age and keeps what was written since', async () => {
    stage(OLD, STAGING_MAX_AGE_MS + 60_000);
    stage(FRESH, STAGING_MAX_AGE_MS - 60_000);
    writeFileSync(join(root, 'not-a-desktop'), 'kept');
    expect(await sweep()).toEqual([OLD]);
    expect(readdirSync(root).sort()).toEqual([FRESH, 'not-a-desktop']);
    expect(logged).toEqual(['removed staging no move will come back for']);
  });

  it('waits for the work queued for the desktop, and keeps staging whose queue was busy', async () => {
    stage(BUSY, STAGING_MAX_AGE_MS + 60_000);
    let release!: () => void;
    // An import of the desktop holds its queue for a while; what it writes may carry old times (tar).
    const importing = queue.run(BUSY, () => new Promise<void>((resolve) => (release = resolve)));
    const swept = sweep();
    await new Promise((r) => setTimeout(r, 1_200));
    expect(readdirSync(root)).toEqual([BUSY]);
    release();
    await importing;
    expect(await swept).toEqual([]);
    expect(readdirSync(join(root, BUSY)).sort()).toEqual(['desktop.part', 'x']);
  });

  it('removes one desktop\'s staging while another desktop\'s queue is held', async () => {
    // Listed first (the fake lists in order), so a sweep that took one desktop at a time would wait on it.
    const first = 'dsk_' + '0'.repeat(24);
    stage(first, STAGING_MAX_AGE_MS + 60_000);
    stage(OLD, STAGING_MAX_AGE_MS + 60_000);
    let release!: () => void;
    const held = queue.run(first, () => new Promise<void>((resolve) => (release = resolve)));
    const swept = sweep();
    await new Promise((r) => setTimeout(r, 1_200));
    expect(readdirSync(root)).toEqual([first]);
    release();
    await held;
    // The held one is kept: its queue was busy.
    expect(await swept).toEqual([OLD]);
  });

  it('on the sandbox runtime, takes the layers only the staging stood on with it', async () => {
    const state = mkdtempSync(join(tmpdir(), 'canto-staging-state-'));
    try {
      const sandbox = new SandboxTransfer(state, new KeyedMutex(), async () => undefined);
      const layer = 'l' + '1'.repeat(16);
      mkdirSync(join(layersDir(state), layer), { recursive: true });
      mkdirSync(join(state, 'desktops'), { recursive: true });
      // An import left its unpacked desktop unit, which names the layer, and its spool.
      mkdirSync(dirname(stagedChainFile(state, OLD)), { recursive: true });
      writeFileSync(stagedChainFile(state, OLD), JSON.stringify({ lower: [layer] }));
      writeFileSync(join(state, 'incoming', OLD, 'desktop.part'), 'spooled');
      expect(await sandbox.stagedDesktops()).toEqual([OLD]);
      const swept = await sweepStaging({ transfer: sandbox, queued: (id, work) => queue.run(id, work), log: () => undefined, now: () => Date.now() + STAGING_MAX_AGE_MS + 60_000 });
      expect(swept).toEqual([OLD]);
      expect(readdirSync(join(state, 'incoming'))).toEqual([]);
      expect(readdirSync(layersDir(state))).toEqual([]);
    } finally {
      rmSync(state, { recursive: true, force: true });
    }
  });
});
