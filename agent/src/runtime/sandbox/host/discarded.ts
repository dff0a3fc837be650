/**
 * Removing a destroyed desktop's files without making the destroy wait for them.
 *
 * A destroy answers once the desktop is stopped and its directory renamed into
 * `<stateDir>/discarded/`: from then on nothing finds it (its id is free, its layers count as
 * unused), and what a client or a move waits for is done. Behind the answer, one directory at a
 * time, its overlay's writable layer is emptied and the overlay unmounted (layers.ts
 * `releaseDisk`: emptied first, so that its dirty pages are dropped rather than written out),
 * then the rest is removed. That work took most of a destroy: about 0.4 s for a desktop holding
 * 20,000 small files and 100 MiB, measured, 1 s for 2 GiB in 256 files and 2 s for 20,000 small
 * files on this machine's disk alone; a drain waits for every source copy's destroy.
 *
 * A wake's restored snapshot goes the same way: removing its fifty-odd files took 2-3 ms of a wake
 * alone and 4-21 ms in a burst of wakes, measured, and nothing reads them again.
 *
 * The overlay stays mounted on the renamed directory until then: a mount follows its directory
 * through a rename, and the mount table names the new path. The layers only a destroyed desktop
 * stood on are collected after the sweep has unmounted its overlay (`collectUnusedLayers`). An
 * agent that stops before a removal finishes leaves the directory behind, mounted or not; the
 * next agent releases and removes it (and collects) when its driver starts. Where the rename
 * cannot be made (the desktops directory on another filesystem than the state directory), the
 * destroy releases and removes the files itself, as before.
 */
import { randomBytes } from 'node:crypto';
import { mkdir, readdir, rename } from 'node:fs/promises';
import { basename, join } from 'node:path';
import { desktopsDir, discardedDir, exists, removeTree } from './layout.js';
import { collectLayers, releaseDisk } from './layers.js';
import type { RuntimeLog } from '../runtime-log.js';

export { discardedDir } from './layout.js';

/** Work that runs in the background at most once at a time per state directory (`coalesced`). */
interface Run {
  again: boolean;
  done: Promise<void>;
}
const sweeps = new Map<string, Run>();
const collections = new Map<string, Run>();

/**
 * Runs `pass` for `key` unless a run is under way, in which case that run makes one more pass
 * (what was asked for meanwhile is taken by it); answers when the run ends. Each pass starts out
 * of the caller's turn of the event loop: the answer the caller is about to send goes first.
 */
function coalesced(runs: Map<string, Run>, key: string, pass: () => Promise<void>): Promise<void> {
  const running = runs.get(key);
  if (running !== undefined) {
    running.again = true;
    return running.done;
  }
  const run: Run = { again: true, done: Promise.resolve() };
  runs.set(key, run);
  run.done = (async () => {
    try {
      while (run.again) {
        run.again = false;
        await new Promise((resolve) => setImmediate(resolve));
        await pass();
      }
    } finally {
      runs.delete(key);
    }
  })();
  return run.done;
}

/**
 * Takes a stopped desktop's directory (or a restored snapshot: `name` then says whose) out of the
 * way with one rename and removes it in the background, its overlay included. A directory that
 * is not there is already gone. `failed` hears of a removal that failed (it is tried again at
 * the next discard or start).
 */
export async function discardTree(stateDir: string, dir: string, failed: (err: unknown) => void, name = basename(dir)): Promise<void> {
  const bin = discardedDir(stateDir);
  await mkdir(bin, { recursive: true, mode: 0o700 });
  try {
    await rename(dir, join(bin, `${name}.${Date.now()}-${randomBytes(3).toString('hex')}`));
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') return;
    if (code !== 'EXDEV' && code !== 'EBUSY') throw err;
    await removeDesktopTree(dir);
    return;
  }
  void sweepDiscarded(stateDir).catch(failed);
}

/** A desktop directory's overlay released (emptied, unmounted), then the directory removed. */
async function removeDesktopTree(dir: string): Promise<void> {
  const disk = join(dir, 'disk');
  // A snapshot has no disk, and then the mount table need not be read.
  if (await exists(disk)) await releaseDisk({ dir, disk });
  await removeTree(dir);
}

/**
 * Removes everything in the discarded directory, and what is discarded while it runs; answers
 * when it is empty. At most one sweep runs per state directory. An entry that cannot be removed
 * (EIO, a file made immutable) is passed over, the rest removed, and the sweep then rejects
 * naming it: one such entry used to end every sweep there, and every layer collection with it.
 */
export function sweepDiscarded(stateDir: string): Promise<void> {
  return coalesced(sweeps, stateDir, async () => {
    const bin = discardedDir(stateDir);
    const names = await readdir(bin).catch((err: NodeJS.ErrnoException) => {
      if (err.code === 'ENOENT') return [] as string[];
      throw err;
    });
    const failed: string[] = [];
    for (const name of names) {
      await removeDesktopTree(join(bin, name)).catch((err: unknown) => failed.push(`${name}: ${String(err)}`));
    }
    if (failed.length > 0) throw new Error(`${failed.length} discarded entr${failed.length === 1 ? 'y' : 'ies'} could not be removed (${failed.slice(0, 3).join('; ')})`);
  });
}

/**
 * Removes the layers no desktop stands on any more (layers.ts `collectLayers`), in the background
 * and after the discarded directories are swept: a destroyed fork's overlay uses its layers
 * until the sweep unmounts it. Reading every desktop's chain costs a destroy nothing this way
 * (two file reads per desktop on the host, tens of milliseconds with a few hundred). At most one
 * collection runs per state directory. Never rejects: what it removed, or could not, is logged.
 */
export function collectUnusedLayers(stateDir: string, log: RuntimeLog, fields: object = {}): Promise<void> {
  return coalesced(collections, stateDir, async () => {
    // Layers are collected whatever the sweep could not remove: at worst they go from under a
    // destroyed desktop's overlay that stayed mounted, which nothing uses.
    const swept = await sweepDiscarded(stateDir).then(() => null, (err: unknown) => err);
    const count = await collectLayers(stateDir, desktopsDir(stateDir));
    if (count > 0) log('disk layers no desktop stands on any more were removed', { ...fields, count });
    if (swept !== null) throw swept;
  }).catch((err: unknown) => log('could not remove destroyed desktops\' files or unused layers', { ...fields, error: String(err) }, 'warn'));
}

/** Resolves once no sweep and no collection runs for the state directory. */
export async function discardsSettled(stateDir: string): Promise<void> {
  await sweepDiscarded(stateDir);
  await collections.get(stateDir)?.done;
}

/**
 * Discards the forks an agent stopped while building (`desktops/<id>.tmp`, layers.ts
 * `createFork`): nothing lists them, and each held its source's snapshot images and its layers
 * for good. Run at the driver's start, when no fork is being built.
 */
export async function discardUnfinishedForks(stateDir: string, failed: (err: unknown) => void): Promise<number> {
  const dir = desktopsDir(stateDir);
  const names = (await readdir(dir).catch(() => [] as string[])).filter((name) => /^dsk_[A-Za-z0-9_-]+\.tmp$/.test(name));
  for (const name of names) await discardTree(stateDir, join(dir, name), failed);
  return names.length;
}

/**
 * Discards the memory snapshot images set aside by earlier failed restores of the desktop at
 * `dir` (`snapshot.failed-<ms>`), all but `kept`: each is a memory's size, and a desktop whose
 * restores keep failing set one more aside at every wake. The newest stays for a look at why.
 */
export async function discardOlderAside(stateDir: string, dir: string, kept: string, failed: (err: unknown) => void): Promise<void> {
  const desktopId = basename(dir);
  for (const name of await readdir(dir).catch(() => [] as string[])) {
    if (/^snapshot\.failed-\d+$/.test(name) && join(dir, name) !== kept) await discardTree(stateDir, join(dir, name), failed, `${desktopId}.${name}`);
  }
}
