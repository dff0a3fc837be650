/**
 * Guests already running when the agent starts, booted by an agent from before the read-only
 * /proc (proc-seal.ts): their /proc is sealed now, from outside, since a mount can be added to a
 * running mount namespace (the spawner's seal leaves what is read-only as it is, so a guest sealed
 * at its boot gains nothing). Their seccomp filter cannot be: nothing puts one on a running
 * process; they get it at their next boot, and confinement.ts sees to that. A guest that held a
 * sysctl, or a directory under /proc/sys, open from before keeps that descriptor until it stops.
 */
import { readdir } from 'node:fs/promises';
import { runningInit } from './cold-boot.js';
import { desktopPaths, desktopsDir, isDesktopId } from './layout.js';
import { sealProcSys } from './proc-seal.js';

/** Seals at a time at the agent's start: each is a process of about a millisecond, and a host may run a thousand guests. */
const SEALS_AT_ONCE = 8;

/** Seals the /proc of each running guest of `stateDir` (a sealed one is left as it is); answers how many it looked at. */
export async function sealRunningGuests(stateDir: string, nsenterPath: string, log: (msg: string, fields?: object, level?: 'warn') => void): Promise<number> {
  // Desktop ids only: a fork an agent stopped while building (`<id>.tmp`) failed the start.
  const ids = (await readdir(desktopsDir(stateDir)).catch(() => [] as string[])).filter(isDesktopId);
  let running = 0;
  let next = 0;
  const worker = async () => {
    while (next < ids.length) {
      const desktopId = ids[next++]!;
      const init = await runningInit(desktopPaths(stateDir, desktopId));
      if (init === null) continue;
      running++;
      await sealRunningGuest(init.pid, nsenterPath, desktopId, log);
    }
  };
  await Promise.all(Array.from({ length: SEALS_AT_ONCE }, worker));
  return running;
}

/** Seals one running guest's /proc; a failure is logged with what to do, not thrown. */
export async function sealRunningGuest(pid: number, nsenterPath: string, desktopId: string, log: (msg: string, fields?: object, level?: 'warn') => void): Promise<void> {
  await sealProcSys(pid, nsenterPath, desktopId, undefined, true).catch((err: unknown) => {
    log('a running guest could not have its /proc made read-only: hibernate and wake it, or destroy it', { desktopId, error: String(err) }, 'warn');
  });
}
