/**
 * Guests already running when the agent starts, booted by an agent from before the read-only
 * /proc (proc-seal.ts): their /proc/sys is sealed now, from outside, since a mount can be added to
 * a running mount namespace. (Their seccomp filter cannot be: nothing puts one on a running
 * process. They get it at their next boot; confinement.ts sees to that.) A guest that held a
 * sysctl open for writing from before keeps that descriptor until it stops.
 */
import { readdir, readFile } from 'node:fs/promises';
import { runningInit } from './cold-boot.js';
import { desktopPaths, desktopsDir } from './layout.js';
import { sealProcSys } from './proc-seal.js';

/** Whether the guest of init `pid` sees a read-only /proc/sys. */
export async function procSysSealed(pid: number): Promise<boolean> {
  const mountinfo = await readFile(`/proc/${pid}/mountinfo`, 'utf8').catch(() => '');
  const procSys = mountinfo.split('\n').map((line) => line.split(' ')).filter((f) => f[4] === '/proc/sys').at(-1);
  return procSys?.[5]?.split(',').includes('ro') ?? false;
}

/** Seals each running guest of `stateDir` whose /proc/sys is writable; answers the desktops it sealed. */
export async function sealRunningGuests(stateDir: string, nsenterPath: string, log: (msg: string, fields?: object, level?: 'warn') => void): Promise<string[]> {
  const sealed: string[] = [];
  for (const desktopId of await readdir(desktopsDir(stateDir)).catch(() => [] as string[])) {
    if (!desktopId.startsWith('dsk_')) continue;
    const init = await runningInit(desktopPaths(stateDir, desktopId));
    if (init === null || (await procSysSealed(init.pid))) continue;
    try {
      await sealProcSys(init.pid, nsenterPath, desktopId);
      sealed.push(desktopId);
    } catch (err) {
      log('a running guest could not have its /proc made read-only: hibernate and wake it, or destroy it', { desktopId, error: String(err) }, 'warn');
    }
  }
  if (sealed.length > 0) log('made the /proc of running guests read-only (booted before it was)', { desktops: sealed }, 'warn');
  return sealed;
}
