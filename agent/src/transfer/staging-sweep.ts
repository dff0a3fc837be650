/**
 * Staging that no move will come back for. An import keeps what it fetched in the desktop's
 * staging directory until it installs it, or until its move is undone (`desktop.import.abort`).
 * A move undone while this host was out of reach never sent that abort, and its staging stayed:
 * gigabytes of spooled units, unpacked files and a pre-copy, and the layers its staged chain
 * names, which the layer collector keeps for it (host/layers.ts).
 *
 * Each staging directory untouched for STAGING_MAX_AGE_MS is removed, in its desktop's queue, so
 * never under an import (imports run in that queue, and any import writes to its staging as it
 * goes), and not when the queue held other work for the desktop first. The age is the newest
 * modification of its directory or of anything at its top: a unit's spool grows while it is
 * fetched, and a listing, an unpacking or a pre-copy is made when its step begins. No move
 * stays in one step that long (a move's operation fails after CANTO_OPERATION_DEADLINE_MS, five
 * minutes by default, and a later move of the desktop starts its import over anyway). The agent
 * sweeps at its start and hourly.
 */
import { readdir, stat } from 'node:fs/promises';
import { join } from 'node:path';
import type { DesktopTransfer } from '../runtime/transfer.js';

/** Staging untouched this long is left over. */
export const STAGING_MAX_AGE_MS = 60 * 60 * 1000;
/** A wait in the desktop's queue longer than this means something ran for the desktop. */
const QUEUE_WAIT_MS = 1_000;
/** How often a running agent looks. */
export const STAGING_SWEEP_MS = 60 * 60 * 1000;

/** The newest change of `dir` or of anything directly in it, in ms since the epoch; null when it is gone. */
export async function lastStagingWrite(dir: string): Promise<number | null> {
  const own = await stat(dir).catch(() => null);
  if (own === null) return null;
  let newest = own.mtimeMs;
  for (const name of await readdir(dir).catch(() => [] as string[])) {
    const st = await stat(join(dir, name)).catch(() => null);
    if (st !== null) newest = Math.max(newest, st.mtimeMs);
  }
  return newest;
}

export interface StagingSweepDeps {
  readonly transfer: DesktopTransfer;
  /** The desktop's command queue (desktop-queue.ts): the removal waits for the work before it. */
  readonly queued: <T>(desktopId: string, work: () => Promise<T>) => Promise<T>;
  readonly log: (msg: string, fields?: object) => void;
  readonly maxAgeMs?: number;
  readonly now?: () => number;
}

/** Removes the staging no move will come back for; answers the desktops whose staging went. */
export async function sweepStaging(deps: StagingSweepDeps): Promise<string[]> {
  const maxAge = deps.maxAgeMs ?? STAGING_MAX_AGE_MS;
  const now = deps.now ?? Date.now;
  const stale = async (desktopId: string) => {
    let dir: string;
    try {
      dir = deps.transfer.stagingDir(desktopId);
    } catch {
      return false; // not a desktop's staging: left alone
    }
    const last = await lastStagingWrite(dir);
    return last !== null && now() - last >= maxAge;
  };
  const dropped: string[] = [];
  // Each in its own desktop's queue, all at once: one queue held for long holds up no other.
  await Promise.all((await deps.transfer.stagedDesktops()).map(async (desktopId) => {
    if (!(await stale(desktopId))) return;
    // Looked at again in the queue. Work that held the queue meanwhile (an import, whose last
    // writes may carry times from its archive) means a move is under way: kept, and judged again
    // at the next sweep.
    const queuedAt = performance.now();
    const gone = await deps.queued(desktopId, async () => {
      if (performance.now() - queuedAt > QUEUE_WAIT_MS || !(await stale(desktopId))) return false;
      await deps.transfer.dropStaging(desktopId);
      return true;
    }).catch((err: unknown) => {
      deps.log('could not remove left-over staging', { desktopId, error: String(err) });
      return false;
    });
    if (gone) dropped.push(desktopId);
  }));
  dropped.sort();
  if (dropped.length > 0) deps.log('removed staging no move will come back for', { desktops: dropped, maxAgeMinutes: Math.round(maxAge / 60_000) });
  return dropped;
}
