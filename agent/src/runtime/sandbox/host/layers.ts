/**
 * Copy-on-write disks for forks. A desktop's disk starts as a plain directory, `disk/`. Forking
 * freezes it: the directory is renamed into the host's layer store (`<stateDir>/layers/<id>`,
 * read-only from then on), and the source and every fork get an overlay mounted at their own
 * `disk/` whose lower layers are that frozen one (and whatever the source already stood on) and
 * whose upper layer is a fresh, empty `upper/`. Nothing is copied, so a fork costs the same with
 * 1 GiB on the disk as with nothing, and the guest still sees the same paths: the sandbox binds
 * `disk/root` and friends whether `disk/` is a directory or an overlay.
 *
 *   <stateDir>/layers/<layerId>/      frozen layers, shared by every desktop whose chain names them
 *   <desktop>/layers.json             {"lower": [topmost layer id, ..., bottom]}; absent: plain disk
 *   <desktop>/upper/, work/           the overlay's writable layer and its work directory
 *   <desktop>/disk/                   the plain disk, or the overlay's mountpoint
 *
 * A layer is removed when the last desktop whose chain names it is destroyed, so destroying a
 * source never breaks its forks. The overlay stays mounted across hibernation (nothing holds it
 * then) and is mounted again on the next start after a host reboot; it is unmounted only to
 * freeze the upper layer, to destroy the desktop, or when `canto up` stops as a whole
 * (`releaseIdleDisks`).
 *
 * Freezing is crash-safe: the new chain is written to `layers.next.json` first, the rename into
 * the store follows, and `layers.next.json` replaces `layers.json` last; a freeze found half done
 * is completed by `recoverFreeze` before anything else touches the desktop.
 */
import { randomBytes } from 'node:crypto';
import { copyFile, link, lstat, mkdir, open, readdir, readFile, realpath, rename, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { newId } from '../../../../../shared/src/ids.js';
import { KeyedMutex } from './keyed-mutex.js';
import { copySparse } from './sparse.js';
import { runToEnd, spawnProcess } from './spawner.js';
import { desktopPaths, desktopsDir, discardedDir, exists, incomingDir, isDesktopId, readJson, syncFilesystem, type DesktopPaths } from './layout.js';
import { runningInit } from './cold-boot.js';
import { parseMountTable } from './mount-table.js';


interface Chain {
  /** Layer ids, topmost first. */
  readonly lower: string[];
}

/**
 * A freeze of a desktop standing on this many layers flattens them into one (`flatten`): an
 * overlay's mount options must name every layer's path within one page of memory, about sixty
 * here, and a desktop past that could never be mounted again, nor its forks.
 */
export const MAX_CHAIN = 24;

export function layersDir(stateDir: string): string {
  return join(stateDir, 'layers');
}

function chainFile(paths: DesktopPaths): string {
  return join(paths.dir, 'layers.json');
}

function nextChainFile(paths: DesktopPaths): string {
  return join(paths.dir, 'layers.next.json');
}

/**
 * Written to disk before it is renamed into place: a chain file is a new name (no replace-rename
 * the file system orders after its data), and one that a power loss left empty would leave its
 * desktop unable to mount, and the layers it names unclaimed, so removed at the next start.
 */
async function writeChain(path: string, chain: Chain): Promise<void> {
  const file = await open(`${path}.tmp`, 'w');
  try {
    await file.writeFile(JSON.stringify(chain));
    await file.sync();
  } finally {
    await file.close();
  }
  await rename(`${path}.tmp`, path);
}

export async function readChain(paths: DesktopPaths): Promise<Chain | null> {
  const chain = await readJson<Chain>(chainFile(paths));
  return chain && Array.isArray(chain.lower) && chain.lower.length > 0 ? chain : null;
}

/** Whether the desktop stands on layers, or was being frozen onto one: its removal may leave some unused. */
export async function standsOnLayers(paths: DesktopPaths): Promise<boolean> {
  return (await readChain(paths)) !== null || (await exists(nextChainFile(paths)));
}

/** Whether `dir` is a mountpoint, from the kernel's mount table. */
export async function isMounted(dir: string): Promise<boolean> {
  return parseMountTable(await readFile('/proc/self/mountinfo', 'utf8')).some((m) => m.mountPoint === dir);
}

/** How long the detach of an overlay may take before its unmount counts as failed. */
const DETACH_MS = 10_000;

/**
 * Unmounts a desktop's overlay, waiting for the detach but not for the sync behind it. As the
 * last reference to an overlay goes, the kernel syncs its whole upper filesystem: every dirty
 * page on it, any desktop's (0.4–0.6 s with 100 MB dirty here, whether in this overlay or
 * elsewhere). Nothing here needs that sync: the files stay in the page cache like any other
 * write. A lazy unmount (a guest that is gone may leave its namespace's reference behind for a
 * moment) detaches the mount first and syncs after, in the same call; the mountpoint leaving the
 * mount table is what this waits for, and `umount` finishes on its own.
 */
async function unmount(dir: string): Promise<void> {
  if (!(await isMounted(dir))) return;
  const child = await spawnProcess('umount', ['-l', dir], { stdio: ['ignore', 'ignore', 'ignore'], detached: true });
  let exit: number | null | undefined;
  child.once('exit', (code: number | null) => (exit = code));
  child.once('error', () => (exit = -1));
  child.unref();
  const deadline = performance.now() + DETACH_MS;
  while (await isMounted(dir)) {
    // Done, and mounted still: another mount stacked on the same point (as before, one goes).
    if (exit === 0) return;
    if (exit !== undefined || performance.now() > deadline) {
      throw new Error(`umount -l ${dir} failed${exit === undefined ? ': still mounted' : ` (${exit})`}`);
    }
    await sleep(5);
  }
}

/** Mounts the desktop's overlay at `disk/` if it stands on layers and is not mounted yet. */
export async function mountDisk(stateDir: string, paths: DesktopPaths): Promise<void> {
  await recoverFreeze(stateDir, paths);
  const chain = await readChain(paths);
  if (chain !== null) await mountOverlay(stateDir, paths, chain);
}

async function mountOverlay(stateDir: string, paths: DesktopPaths, chain: Chain): Promise<void> {
  if (await isMounted(paths.disk)) return;
  const upper = join(paths.dir, 'upper');
  const work = join(paths.dir, 'work');
  await mkdir(upper, { recursive: true });
  // The work directory must be empty of a previous mount's leftovers.
  await rm(work, { recursive: true, force: true });
  await mkdir(work, { recursive: true });
  await mkdir(paths.disk, { recursive: true });
  const lowerdir = chain.lower.map((id) => join(layersDir(stateDir), id)).join(':');
  const mounted = await runToEnd('mount', ['-t', 'overlay', 'overlay', '-o', `lowerdir=${lowerdir},upperdir=${upper},workdir=${work}`, paths.disk]);
  if (mounted.code !== 0) throw new Error(`mount of ${paths.disk} failed (${mounted.code ?? 'killed'}): ${mounted.stderr}`);
}

/**
 * Freezes the desktop's writable layer into the store and returns its new chain; the desktop
 * gets a fresh upper layer on its next mount. The desktop must be stopped. Under the store's
 * lock, as a collection scans: one that had read this desktop's chain files before the new
 * layer's chain was written, and listed the store after its rename, removed the new layer (the
 * desktop's whole disk, for a first fork) from under the source and every fork.
 */
export async function freeze(stateDir: string, paths: DesktopPaths): Promise<Chain> {
  await recoverFreeze(stateDir, paths);
  const copy = await flattenCopy(stateDir, paths);
  return withLayerStore(stateDir, () => freezeLocked(stateDir, paths, copy));
}

async function freezeLocked(stateDir: string, paths: DesktopPaths, flattened: string | null): Promise<Chain> {
  await completeFreeze(stateDir, paths);
  if (flattened !== null) return flatten(stateDir, paths, flattened);
  const current = await readChain(paths);
  // Nothing written since the last freeze (a repeated fork command): the chain is the same.
  if (current !== null && (await readdir(join(paths.dir, 'upper')).catch(() => [])).length === 0) return current;
  await mkdir(layersDir(stateDir), { recursive: true });
  const layer = newId('layer');
  const next: Chain = { lower: [layer, ...(current?.lower ?? [])] };
  await writeChain(nextChainFile(paths), next);
  try {
    if (current === null) {
      await rename(paths.disk, join(layersDir(stateDir), layer));
    } else {
      await unmount(paths.disk);
      await rename(join(paths.dir, 'upper'), join(layersDir(stateDir), layer));
    }
  } catch (err) {
    // Nothing moved (a rename is whole or not at all): the freeze is undone, so the desktop
    // keeps its chain and starts as before, instead of every start retrying a rename that
    // cannot work (EXDEV: the store on another filesystem).
    await rm(nextChainFile(paths), { force: true });
    throw err;
  }
  await rename(nextChainFile(paths), chainFile(paths));
  return next;
}

/**
 * The first half of flattening a desktop whose chain reached MAX_CHAIN (and which has written
 * since its last freeze): its whole disk as its overlay shows it, copied (`cp -a`: owners, modes,
 * times, extended attributes, hard links; holes kept) into `flatten.tmp/` in its own directory and
 * written to disk, outside the store's lock (a copy of a large disk would hold every import and
 * collection of the host meanwhile), and where no collection looks. Null when there is nothing to
 * flatten. The desktop is stopped and under its mutex, so neither chain nor disk changes after.
 */
async function flattenCopy(stateDir: string, paths: DesktopPaths): Promise<string | null> {
  const current = await readChain(paths);
  if (current === null || current.lower.length < MAX_CHAIN || (await readdir(join(paths.dir, 'upper')).catch(() => [])).length === 0) return null;
  await mountOverlay(stateDir, paths, current);
  const copy = join(paths.dir, 'flatten.tmp');
  await rm(copy, { recursive: true, force: true });
  await mkdir(copy);
  const copied = await runToEnd('cp', ['-a', '--sparse=always', `${paths.disk}/.`, copy]);
  try {
    if (copied.code !== 0) throw new Error(`flattening the disk of ${paths.dir} failed (${copied.code ?? 'killed'}): ${copied.stderr.trim()}`);
    // On disk before anything names it: the old layers go once nothing does.
    await syncFilesystem(copy);
  } catch (err) {
    await rm(copy, { recursive: true, force: true });
    throw err;
  }
  return copy;
}

/**
 * The second half, under the store's lock: the copy becomes the desktop's one layer, and its
 * chain starts over there. Crash-safe like a freeze: the old overlay is unmounted before the new
 * chain is written (recovery would otherwise leave it mounted under a chain that no longer names
 * its layers, which a collection then removes from under it), the chain names the layer only once
 * it is in the store, and the old writable layer is renamed out of the way whole before it is
 * removed (a half-removed one could keep opaque directories that hide the new layer's files).
 */
async function flatten(stateDir: string, paths: DesktopPaths, copy: string): Promise<Chain> {
  const layer = newId('layer');
  await rename(copy, join(layersDir(stateDir), layer));
  await unmount(paths.disk);
  const next: Chain = { lower: [layer] };
  await writeChain(nextChainFile(paths), next);
  await rename(nextChainFile(paths), chainFile(paths));
  const spent = join(paths.dir, 'upper.flattened');
  await rm(spent, { recursive: true, force: true });
  await rename(join(paths.dir, 'upper'), spent).catch(() => undefined);
  await rm(spent, { recursive: true, force: true });
  return next;
}

/**
 * Completes a freeze an agent crash interrupted (see the module comment), under the store's lock
 * as a freeze is; nothing to do (the usual case) takes no lock.
 */
export async function recoverFreeze(stateDir: string, paths: DesktopPaths): Promise<void> {
  if (!(await exists(nextChainFile(paths)))) return;
  await withLayerStore(stateDir, () => completeFreeze(stateDir, paths));
}

async function completeFreeze(stateDir: string, paths: DesktopPaths): Promise<void> {
  const next = await readJson<Chain>(nextChainFile(paths));
  if (next === null) return;
  const layer = join(layersDir(stateDir), next.lower[0] ?? '');
  const current = await readChain(paths);
  const source = current === null ? paths.disk : join(paths.dir, 'upper');
  // The overlay of the old chain goes before the new chain is in place (a flatten unmounts it
  // first; an agent killed in between must not leave it mounted under a chain that does not name
  // its layers).
  if (current !== null && (await isMounted(paths.disk))) await unmount(paths.disk);
  if (!(await exists(layer))) {
    try {
      if (await exists(source)) await rename(source, layer);
    } catch {
      // The layer never moved: the freeze is undone (see freeze) and the desktop keeps its chain.
      await rm(nextChainFile(paths), { force: true });
      return;
    }
  }
  await rename(nextChainFile(paths), chainFile(paths));
}

/**
 * Creates a fork's directory from a frozen source: the same chain, an empty upper layer, hard
 * links to the source's snapshot images (CRIU only reads them; each desktop later removes its
 * own names), and a copy of the framebuffer file (Xvfb maps it shared, so each fork needs its
 * own). Built under a temporary name and renamed into place, so a fork exists whole or not at all.
 */
export async function createFork(source: DesktopPaths, fork: DesktopPaths, chain: Chain, markers: readonly string[]): Promise<void> {
  const tmp = `${fork.dir}.tmp`;
  await rm(tmp, { recursive: true, force: true });
  try {
    await buildFork(source, fork, chain, markers, tmp);
  } catch (err) {
    // Left, it would hold the source's images and its layers for good (nothing lists it).
    await rm(tmp, { recursive: true, force: true }).catch(() => undefined);
    throw err;
  }
}

async function buildFork(source: DesktopPaths, fork: DesktopPaths, chain: Chain, markers: readonly string[], tmp: string): Promise<void> {
  const at = (p: string) => join(tmp, p.slice(fork.dir.length + 1));
  for (const d of [fork.disk, join(fork.dir, 'upper'), fork.fb, fork.run]) await mkdir(at(d), { recursive: true });
  await writeChain(at(chainFile(fork)), chain);
  if (await exists(source.snapshot)) {
    await mkdir(at(fork.snapshot));
    for (const name of await readdir(source.snapshot)) await link(join(source.snapshot, name), join(at(fork.snapshot), name));
  }
  // The guest writes that directory too: only its regular files are copied (copySparse opens
  // none through a symlink), so a fork never carries a host file a guest pointed at.
  for (const name of await readdir(source.fb).catch(() => [] as string[])) {
    if ((await lstat(join(source.fb, name)).catch(() => null))?.isFile()) await copySparse(join(source.fb, name), join(at(fork.fb), name));
  }
  for (const marker of markers) {
    const from = join(source.dir, marker);
    if (await exists(from)) await copyFile(from, join(tmp, marker));
  }
  await rename(tmp, fork.dir);
}

/**
 * Unmounts a desktop's overlay before its directory is removed, its writable layer emptied
 * first: the layer's dirty pages are then dropped with its files, instead of written out by the
 * sync the unmount sets off (see unmount), which a removal would otherwise wait for. Nothing
 * uses the overlay any more, so changing its upper layer beneath it is safe here.
 */
export async function releaseDisk(paths: Pick<DesktopPaths, 'dir' | 'disk'>): Promise<void> {
  if (await isMounted(paths.disk)) await rm(join(paths.dir, 'upper'), { recursive: true, force: true, maxRetries: 3 });
  await unmount(paths.disk);
}

/**
 * Unmounts the overlays of the desktops under `stateDir` that do not run, for a machine whose
 * Canto stops as a whole (`canto up`), so that no mount of it stays behind: the state is the
 * one a host reboot leaves, and each desktop's next start mounts its overlay again. The agent
 * must be stopped: nothing may start a desktop meanwhile. Answers how many were unmounted.
 */
export async function releaseIdleDisks(stateDir: string): Promise<number> {
  // Mounts are found by real path, as the driver works on it (a symlinked state dir otherwise
  // matched none of them, and every overlay stayed mounted).
  stateDir = await realpath(stateDir).catch(() => stateDir);
  let released = 0;
  for (const name of await readdir(desktopsDir(stateDir)).catch(() => [] as string[])) {
    if (!isDesktopId(name)) continue;
    const paths = desktopPaths(stateDir, name);
    if (!(await isMounted(paths.disk)) || (await runningInit(paths)) !== null) continue;
    await unmount(paths.disk);
    released++;
  }
  return released;
}

/**
 * Where a desktop being moved here is unpacked before it is installed (sandbox-transfer.ts): its
 * chain there already counts, so a layer an import found held and did not fetch is not collected
 * from under it.
 */
export function stagedChainFile(stateDir: string, desktopId: string): string {
  return join(incomingDir(stateDir), desktopId, 'x', 'desktop', 'layers.json');
}

const storeLocks = new Map<string, KeyedMutex>();

/**
 * Runs `fn` while no other collection, import or freeze changes the state dir's layer store: an
 * import checks that the layers it counted on are still there and renames its own in, a freeze
 * renames a desktop's layer in, and a collection must not decide from a listing taken in between.
 */
export function withLayerStore<T>(stateDir: string, fn: () => Promise<T>): Promise<T> {
  let lock = storeLocks.get(stateDir);
  if (lock === undefined) storeLocks.set(stateDir, (lock = new KeyedMutex()));
  return lock.run('layers', fn);
}

/** Removes layers no remaining desktop (nor a desktop being imported) stands on. */
export function collectLayers(stateDir: string, desktopsDir: string): Promise<number> {
  return withLayerStore(stateDir, async () => {
    const inUse = new Set<string>();
    for (const name of await readdir(desktopsDir).catch(() => [] as string[])) {
      for (const file of ['layers.json', 'layers.next.json']) {
        const chain = await readJson<Chain>(join(desktopsDir, name, file));
        for (const id of chain?.lower ?? []) inUse.add(id);
      }
    }
    for (const name of await readdir(incomingDir(stateDir)).catch(() => [] as string[])) {
      const chain = await readJson<Chain>(stagedChainFile(stateDir, name));
      for (const id of chain?.lower ?? []) inUse.add(id);
    }
    let removed = 0;
    for (const id of await readdir(layersDir(stateDir)).catch(() => [] as string[])) {
      if (inUse.has(id)) continue;
      // Out of the store in one rename, then removed: a removal cut short (a crash, a file it
      // could not remove) must not leave part of a layer under its id, which an import would
      // take for the whole layer and not fetch. What is left in `discarded/` is swept later.
      const gone = join(discardedDir(stateDir), `layer-${id}.${Date.now()}-${randomBytes(3).toString('hex')}`);
      await mkdir(discardedDir(stateDir), { recursive: true, mode: 0o700 });
      await rename(join(layersDir(stateDir), id), gone);
      // Out of the store already; what cannot be removed now, the next sweep of `discarded/` tries.
      await rm(gone, { recursive: true, force: true, maxRetries: 3 }).catch(() => undefined);
      removed++;
    }
    return removed;
  });
}
