/**
 * What the host holds: each desktop with a disk, whether its guest init runs, whether it has a
 * memory snapshot; desktop templates (golden.ts) are not desktops. The checks are synchronous,
 * with a turn of the event loop every LIST_TURN desktops: done as thread-pool round trips, they
 * cost 400-650 ms of CPU per listing with a thousand desktops on the host (measured), and the
 * agent lists at every metrics scrape and every hello.
 */
import { existsSync } from 'node:fs';
import { readdir } from 'node:fs/promises';
import { join } from 'node:path';
import type { DesktopStatus } from '../../driver.js';
import { runningInitSync } from './cold-boot.js';
import { desktopPaths, desktopsDir, hasDiskSync, isDesktopId, TEMPLATE_FILE } from './layout.js';

/** Desktops checked per turn of the event loop. */
const LIST_TURN = 100;

export async function listDesktops(stateDir: string): Promise<DesktopStatus[]> {
  const names = await readdir(desktopsDir(stateDir)).catch(() => [] as string[]);
  const out: DesktopStatus[] = [];
  for (const [i, desktopId] of names.sort().entries()) {
    if (i > 0 && i % LIST_TURN === 0) await new Promise((resolve) => setImmediate(resolve));
    if (!isDesktopId(desktopId) || existsSync(join(desktopsDir(stateDir), desktopId, TEMPLATE_FILE))) continue;
    const status = desktopStatus(stateDir, desktopId);
    if (status !== null) out.push(status);
  }
  return out;
}

/** One desktop's status; null when it has no disk. */
export function desktopStatus(stateDir: string, desktopId: string): DesktopStatus | null {
  const paths = desktopPaths(stateDir, desktopId);
  if (!hasDiskSync(paths)) return null;
  return { desktopId, running: runningInitSync(paths) !== null, hasSnapshot: existsSync(paths.snapshot) };
}
