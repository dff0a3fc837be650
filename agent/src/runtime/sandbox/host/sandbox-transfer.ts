/**
 * Moving stopped sandbox desktops between hosts (agent/src/runtime/transfer.ts): which files make
 * up a desktop's units, and how fetched units are installed.
 *
 * The `desktop` unit is the desktop directory minus what belongs to this host only: its writable
 * layer (`disk/` when plain; `upper/` and `layers.json` when it is an overlay, never the mounted
 * `disk/` nor the overlay's `work/`), the memory snapshot with the framebuffer file its images
 * map, the display record and the markers. Left out: `run/` (pids, logs, sockets of this host),
 * `rootfs/` (an empty skeleton every start rebuilds), an unfinished `snapshot.tmp/`, images set
 * aside after a failed restore, and temporary files. A list of what goes, not of what stays, so
 * a file some later change adds does not leak into other hosts unnoticed. Each frozen layer the
 * chain names is a `layer-<id>` unit of its own: forks moved one after another share them.
 *
 * An import unpacks into `<stateDir>/incoming/<id>/x/<unit>/`, then installs: under the layer
 * store's lock (layers.ts) each missing layer is renamed into the store, and the desktop
 * directory is renamed into `desktops/` last, carrying `imported.json`. One rename each, on one
 * filesystem, with the filesystem written to disk before the renames and after them: a crash, a
 * power loss included, leaves the desktop either absent (staging still there, the import resumes)
 * or whole, and an import answers only once its copy is on disk (the source deletes its own).
 * `imported.json` marks a copy that has not started here; only such a copy may be discarded by a
 * rolled-back move.
 *
 * A pre-copy (precopy-files.ts) reads cold files of the writable layer while the desktop runs
 * and unpacks them on the target into `<stateDir>/incoming/<id>/pre/`; the `desktop` unit then
 * leaves out those unchanged since, and its unpacking starts by linking them into place.
 */
import { mkdir, readdir, rename, rm, unlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { AgentFailure } from '../../../../../shared/src/protocol.js';
import {
  DESKTOP_UNIT, layerUnit, type DesktopTransfer, type HeldDesktop, type ImportRecord, type InstallSpec, type PrecopyFiles, type ReadOptions, type UnitSink, type UnitStream,
} from '../../transfer.js';
import { runningInit } from './cold-boot.js';
import type { KeyedMutex } from './keyed-mutex.js';
import { collectLayers, layersDir, readChain, recoverFreeze, releaseDisk, stagedChainFile, withLayerStore } from './layers.js';
import { discardTree } from './discarded.js';
import { assertDesktopId, desktopPaths, desktopsDir, exists, hasDisk, incomingDir, readJson, removeTree, syncFilesystem, type DesktopPaths } from './layout.js';
import { cgroupPids } from './cgroups.js';
import { identify, linkPrecopied, scanCold, sharedWritableMaps } from './precopy-files.js';
import { fileListStream, tarSize, tarStream, untar } from './unit-tar.js';

/** A pre-copy picks files whose ctime is at least this old (precopy-files.ts: clock ticks). */
const PRECOPY_COLD_MS = 200;
/** …and at least this large: smaller ones cost more in requests than they save. */
const PRECOPY_MIN_BYTES = 64 * 1024;

/**
 * Members of a desktop directory that move with it, in byte order (tar's `--sort=name`).
 * `display.json` is only written by agents that set a cold boot's display size again (the SPEC
 * has a cold boot revert it); it still moves, so units of both kinds of agent match.
 */
const PLAIN_MEMBERS = ['.ready', 'disk', 'display.json', 'fb', 'first-boot-done', 'snapshot'];
const OVERLAY_MEMBERS = ['.ready', 'display.json', 'fb', 'first-boot-done', 'layers.json', 'snapshot', 'upper'];

const IMPORT_RECORD = 'imported.json';
const LAYER_UNIT = /^layer-(lyr_[0-9a-v]{24})$/;

/**
 * What of a stopped desktop's directory goes into its `desktop` unit: the members above that
 * exist, for a plain disk or an overlay according to `layers.json`. The framebuffer file (16 MiB)
 * goes only with a memory snapshot, whose Xvfb maps it; a cold boot makes a new one.
 */
export async function desktopUnitMembers(dir: string): Promise<string[]> {
  const present = new Set(await readdir(dir));
  const members = present.has('layers.json') ? OVERLAY_MEMBERS : PLAIN_MEMBERS;
  return members.filter((name) => present.has(name) && (name !== 'fb' || present.has('snapshot')));
}

export class SandboxTransfer implements DesktopTransfer {
  constructor(
    private readonly stateDir: string,
    /** The driver's per-desktop lifecycle mutex: no start, fork or destroy runs meanwhile. */
    private readonly mutex: KeyedMutex,
    /** Writes the filesystem holding a path to disk (tests watch when it is called). */
    private readonly flushFs: (path: string) => Promise<void> = syncFilesystem,
    /** bubblewrap, which confines the pre-copy's reads of a running desktop (unit-tar.ts). */
    private readonly bwrap = 'bwrap',
  ) {}

  async inspect(desktopId: string): Promise<HeldDesktop> {
    const paths = desktopPaths(this.stateDir, desktopId);
    const held = await hasDisk(paths);
    return {
      held,
      running: held && (await isRunning(paths)),
      imported: held ? await readJson<ImportRecord>(join(paths.dir, IMPORT_RECORD)) : null,
    };
  }

  units(desktopId: string): Promise<string[]> {
    const paths = desktopPaths(this.stateDir, desktopId);
    return this.mutex.run(desktopId, async () => {
      if (!(await hasDisk(paths))) throw new AgentFailure('not_found', `no disk for ${desktopId} on this host`, false);
      if (await isRunning(paths)) throw new AgentFailure('conflict', `${desktopId} is running on this host`, false);
      // A fork the agent crashed in the middle of is completed first, or the chain would be wrong.
      await recoverFreeze(this.stateDir, paths);
      const chain = await readChain(paths);
      return [DESKTOP_UNIT, ...(chain?.lower ?? []).map(layerUnit)];
    });
  }

  async read(desktopId: string, unitId: string, leaveOut: readonly string[] = [], how: ReadOptions = {}): Promise<UnitStream> {
    const paths = desktopPaths(this.stateDir, desktopId);
    if (unitId === DESKTOP_UNIT) return tarStream(paths.dir, await desktopUnitMembers(paths.dir), leaveOut, how);
    const layer = this.layerDir(unitId);
    if (!(await exists(layer))) throw new AgentFailure('not_found', `no ${unitId} on this host`, false);
    return tarStream(layer, ['.'], [], how);
  }

  async size(desktopId: string, unitId: string, leaveOut: readonly string[] = []): Promise<number> {
    const paths = desktopPaths(this.stateDir, desktopId);
    if (unitId === DESKTOP_UNIT) return tarSize(paths.dir, await desktopUnitMembers(paths.dir), leaveOut);
    const layer = this.layerDir(unitId);
    if (!(await exists(layer))) throw new AgentFailure('not_found', `no ${unitId} on this host`, false);
    return tarSize(layer, ['.']);
  }

  async holds(unitId: string): Promise<boolean> {
    return unitId !== DESKTOP_UNIT && (await exists(this.layerDir(unitId)));
  }

  stagingDir(desktopId: string): string {
    assertDesktopId(desktopId);
    return join(incomingDir(this.stateDir), desktopId);
  }

  async stagedChain(desktopId: string): Promise<string[]> {
    assertDesktopId(desktopId);
    return (await readJson<{ lower?: string[] }>(stagedChainFile(this.stateDir, desktopId)))?.lower ?? [];
  }

  async unpack(desktopId: string, unitId: string, reuse: readonly string[] = []): Promise<UnitSink> {
    if (unitId !== DESKTOP_UNIT) this.layerDir(unitId); // checks the id
    const dest = join(this.stagingDir(desktopId), 'x', unitId);
    await rm(dest, { recursive: true, force: true });
    await mkdir(dest, { recursive: true });
    if (reuse.length > 0) await linkPrecopied(this.preDir(desktopId), dest, reuse);
    return untar(dest);
  }

  readonly precopy: PrecopyFiles = {
    scan: async (desktopId) => {
      const paths = desktopPaths(this.stateDir, desktopId);
      if (!(await hasDisk(paths))) throw new AgentFailure('not_found', `no disk for ${desktopId} on this host`, false);
      // The writable layer as the unit names it: `upper/` under an overlay (never the mounted `disk/`).
      const roots = (await exists(join(paths.dir, 'layers.json'))) ? ['upper'] : ['disk'];
      const mapped = await sharedWritableMaps(await cgroupPids(desktopId));
      return scanCold(paths.dir, roots, { coldMs: PRECOPY_COLD_MS, minBytes: PRECOPY_MIN_BYTES, mapped });
    },
    read: (desktopId, files, how) => fileListStream(desktopPaths(this.stateDir, desktopId).dir, files, how, this.bwrap),
    identify: (desktopId, files) => identify(desktopPaths(this.stateDir, desktopId).dir, files),
    unpack: async (desktopId) => {
      const dest = this.preDir(desktopId);
      await rm(dest, { recursive: true, force: true });
      await mkdir(dest, { recursive: true });
      const sink = await untar(dest);
      // Flushed while the desktop still runs on the source: the pre-copy is most of a move's
      // bytes, and writing them out after the stop would lengthen the downtime by as much.
      const done = sink.done.then(() => this.flushFs(dest));
      done.catch(() => undefined);
      return { ...sink, done };
    },
    holds: async (desktopId, files) => {
      const pre = this.preDir(desktopId);
      for (const file of files) if (!(await exists(join(pre, file)))) return false;
      return true;
    },
    drop: async (desktopId) => {
      await removeTree(this.preDir(desktopId));
    },
  };

  private preDir(desktopId: string): string {
    return join(this.stagingDir(desktopId), 'pre');
  }

  install(desktopId: string, spec: InstallSpec): Promise<void> {
    const paths = desktopPaths(this.stateDir, desktopId);
    const staging = this.stagingDir(desktopId);
    const staged = join(staging, 'x', DESKTOP_UNIT);
    return this.mutex.run(desktopId, async () => {
      if (await hasDisk(paths)) throw new AgentFailure('conflict', `${desktopId} is already on this host`, false);
      if (!spec.unpacked.includes(DESKTOP_UNIT) || !(await exists(join(staged, '.ready')))) {
        throw new AgentFailure('runtime_error', `the desktop unit of ${desktopId} is not unpacked`, true);
      }
      // What `prepare` would have made and the unit leaves out: run/ for logs and pids, fb/ for Xvfb.
      await mkdir(join(staged, 'run'), { recursive: true });
      await mkdir(join(staged, 'fb'), { recursive: true });
      await writeFile(join(staged, IMPORT_RECORD), JSON.stringify(spec.record));
      const chain = await this.stagedChain(desktopId);
      // On disk before the renames: after a power loss the renamed copy could otherwise hold
      // files whose data never reached the disk. And after them, below: the source deletes its
      // copy once this one is confirmed.
      await this.flushFs(staging);
      await withLayerStore(this.stateDir, async () => {
        await mkdir(layersDir(this.stateDir), { recursive: true });
        for (const layer of chain) {
          const target = join(layersDir(this.stateDir), layer);
          // Layers are immutable: one already here with this id is the same layer.
          if (await exists(target)) continue;
          const unpacked = join(staging, 'x', layerUnit(layer));
          if (!(await exists(unpacked))) {
            throw new AgentFailure('runtime_error', `layer ${layer} of ${desktopId} was removed from this host meanwhile; import again`, true);
          }
          await rename(unpacked, target);
        }
        await mkdir(desktopsDir(this.stateDir), { recursive: true });
        await rename(staged, paths.dir);
      });
      await this.flushFs(paths.dir);
      await removeTree(staging);
    });
  }

  flush(desktopId: string): Promise<void> {
    return this.flushFs(desktopPaths(this.stateDir, desktopId).dir);
  }

  async started(desktopId: string): Promise<boolean> {
    try {
      await unlink(join(desktopPaths(this.stateDir, desktopId).dir, IMPORT_RECORD));
      return true;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return false;
      throw err;
    }
  }

  async stagedDesktops(): Promise<string[]> {
    return (await readdir(incomingDir(this.stateDir)).catch(() => [] as string[])).filter((name) => name.startsWith('dsk_'));
  }

  dropStaging(desktopId: string): Promise<void> {
    return this.mutex.run(desktopId, async () => {
      // Out of incoming/ in one rename, removed behind: a removal cut short must not leave a
      // unit's `.done` mark beside half of its unpacking, which a later import would install.
      await discardTree(this.stateDir, this.stagingDir(desktopId), () => undefined, `${desktopId}.staging`);
      // Layers only its staged chain kept go with it.
      await collectLayers(this.stateDir, desktopsDir(this.stateDir));
    });
  }

  discard(desktopId: string): Promise<void> {
    const paths = desktopPaths(this.stateDir, desktopId);
    return this.mutex.run(desktopId, async () => {
      if (await hasDisk(paths)) {
        if (await isRunning(paths)) throw new AgentFailure('conflict', `${desktopId} is running on this host`, false);
        if (!(await exists(join(paths.dir, IMPORT_RECORD)))) {
          throw new AgentFailure('conflict', `${desktopId} has run on this host since it was imported (or was never imported); it is kept`, false);
        }
        await releaseDisk(paths);
        await removeTree(paths.dir);
      }
      await removeTree(this.stagingDir(desktopId));
      // Layers only this copy (or its staging) stood on go with it.
      await collectLayers(this.stateDir, desktopsDir(this.stateDir));
    });
  }

  private layerDir(unitId: string): string {
    const layer = LAYER_UNIT.exec(unitId)?.[1];
    if (layer === undefined) throw new AgentFailure('bad_request', `invalid unit ${JSON.stringify(unitId)}`, false);
    return join(layersDir(this.stateDir), layer);
  }
}

async function isRunning(paths: DesktopPaths): Promise<boolean> {
  return (await runningInit(paths)) !== null;
}
