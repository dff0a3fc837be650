/**
 * Taking a running desktop's memory snapshot for a hibernate or a move's stop.
 *
 * CRIU resumes the guest when a dump fails, so a failed dump is tried once more while the guest
 * runs (under load on two cores a dump failed now and then for a passing cause). When that fails
 * too, a hibernate stops the desktop cold (the caller does): a desktop must stop whatever happens
 * (its meter, its idle timeout), and its disk is kept. A move's stop instead leaves it running and
 * fails (`requireSnapshot`): the move goes back, and no program of it ends.
 *
 * A dump that succeeded has ended the guest, and its images are then the desktop's only memory:
 * they go in place even over spent images an interrupted agent left there (see `install`).
 */
import { rename, rm } from 'node:fs/promises';
import { AgentFailure } from '../../../../../shared/src/protocol.js';
import type { RuntimeLog } from '../runtime-log.js';
import type { InitProcess } from './cold-boot.js';
import { dump, type CriuInfo } from './criu.js';
import { isSameProcess } from './host-procs.js';
import { exists, type DesktopPaths } from './layout.js';

/** Dumps tried before giving up: under load a dump failed now and then for a passing cause. */
const DUMP_ATTEMPTS = 2;

export interface TakeOptions {
  readonly desktopId: string;
  /** A move's stop: a desktop whose dump fails runs on and this throws, instead of answering false. */
  readonly requireSnapshot: boolean;
  readonly log: RuntimeLog;
  /** Removes `paths.snapshot`, images the guest has run past. */
  readonly discardSpent: () => Promise<void>;
}

/**
 * Dumps the guest into `paths.snapshot`; true once the images are in place (the guest has ended),
 * false when the caller is to stop it cold. Throws the move's refusal with `requireSnapshot`.
 */
export async function takeSnapshot(criu: CriuInfo, paths: DesktopPaths, init: InitProcess, options: TakeOptions): Promise<boolean> {
  const { desktopId, log } = options;
  for (let attempt = 1; attempt <= DUMP_ATTEMPTS; attempt++) {
    try {
      await dump(criu, paths, init);
    } catch (err) {
      await rm(paths.snapshotTmp, { recursive: true, force: true });
      const running = await isSameProcess(init.pid, init.startTime);
      const again = attempt < DUMP_ATTEMPTS && running;
      if (!again && running && options.requireSnapshot) {
        log('memory snapshot failed; the desktop keeps running, as its move needs its memory', { desktopId, attempt, error: String(err) }, 'warn');
        throw new AgentFailure('snapshot_failed', 'its memory snapshot failed, so it was not stopped: it runs on here with its programs (the agent log says why)', false);
      }
      log(again ? 'memory snapshot failed; trying once more' : 'memory snapshot failed; cold stop instead: its running programs end', { desktopId, attempt, error: String(err) }, again ? undefined : 'warn');
      if (!again) return false;
      continue;
    }
    await install(paths, options);
    return true;
  }
  return false;
}

/**
 * Puts the images of a dump that succeeded in place. Images already there are spent (the guest
 * ran after them; a start removes them, but an agent stopped between a restore and that removal
 * leaves them): they go first. Left, the rename failed, the new images were dropped with the
 * guest already ended, and the next wake restored the old memory over a newer disk. A failure
 * here fails the hibernate with the new images kept in `snapshot.tmp`, which the next start keeps.
 */
async function install(paths: DesktopPaths, options: TakeOptions): Promise<void> {
  if (await exists(paths.snapshot)) {
    options.log('spent memory snapshot images replaced by the new ones', { desktopId: options.desktopId }, 'warn');
    await options.discardSpent();
  }
  await rename(paths.snapshotTmp, paths.snapshot);
}
