/**
 * Kernel limits every guest shares with every other and with the host's root. Guests are root
 * without a user namespace, and the kernel counts some things per user: inotify instances
 * (`fs.inotify.max_user_instances`, 128 by default) and inotify watches
 * (`fs.inotify.max_user_watches`). One desktop that opens 128 inotify instances (a probe in a
 * guest did, in a loop) left no other desktop, and no root process of the host (systemd, the
 * agent), able to open one, and a host of desktops running ordinary programs (browsers, editors
 * and file managers watch files) reaches 128 without anyone trying. Pipe buffers are counted per
 * user too (`fs.pipe-user-pages-soft`, 64 MiB): past it, every new pipe of every guest (which
 * lack CAP_SYS_RESOURCE) gets two pages instead of sixteen and none can be grown, so one desktop
 * holding large pipes slowed every other's.
 *
 * At the driver's start the agent raises each to at least SHARED_LIMITS
 * (`CANTO_AGENT_RAISE_SHARED_LIMITS`, default `true`), never lowering one set higher. With the
 * per-user counts out of the way, what bounds a guest is its own: every instance, watch and pipe
 * is a descriptor of its processes, and their kernel memory is charged to its memory cgroup. The
 * values are the kernel's, for the whole host, until a reboot (operators.md says how to keep
 * them). Where they cannot be written (a read-only /proc/sys in a container), the agent says so
 * and goes on.
 *
 * Still shared: POSIX message queues' bytes, summed per user and checked against the caller's
 * RLIMIT_MSGQUEUE (800 KB), so one desktop's few queues leave the others unable to create one.
 * Lifting the limit for the guests needs CAP_SYS_RESOURCE, which root may lack (in a container).
 */
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

/** The floor for each limit, by its path under /proc/sys. */
export const SHARED_LIMITS: Readonly<Record<string, number>> = {
  'fs/inotify/max_user_instances': 1 << 20,
  'fs/inotify/max_user_watches': 1 << 22,
  // In pages: 256 GiB, past any host's memory. Each guest's pipes are charged to its cgroup.
  'fs/pipe-user-pages-soft': 1 << 26,
};

/** Limits for which 0 means none at all: the highest value, never to be raised. */
const ZERO_IS_UNLIMITED = new Set(['fs/pipe-user-pages-soft']);

export interface RaisedLimit {
  readonly name: string;
  readonly from: number;
  readonly to: number;
}

/** Raises each limit below its floor; answers what it raised. `procSys` is for tests. */
export async function raiseSharedLimits(enabled: boolean, log: (msg: string, fields?: object, level?: 'warn') => void, procSys = '/proc/sys'): Promise<RaisedLimit[]> {
  if (!enabled) return [];
  const raised: RaisedLimit[] = [];
  for (const [name, floor] of Object.entries(SHARED_LIMITS)) {
    const path = join(procSys, name);
    const text = (await readFile(path, 'utf8').catch(() => '')).trim();
    const now = Number(text);
    // Unreadable (no such limit on this kernel) or already high enough: left as it is.
    if (text === '' || !Number.isFinite(now) || now >= floor || (now === 0 && ZERO_IS_UNLIMITED.has(name))) continue;
    const sysctl = name.replace(/\//g, '.');
    try {
      await writeFile(path, `${floor}\n`);
      raised.push({ name: sysctl, from: now, to: floor });
    } catch (err) {
      log('could not raise a limit every desktop shares with the host', {
        sysctl, value: now, wanted: floor, error: String(err), advice: `set ${sysctl}=${floor} on the host (sysctl.d): one desktop can use up the ${now} the host's root and every desktop share`,
      }, 'warn');
    }
  }
  if (raised.length > 0) log('raised limits every desktop shares with the host', { raised });
  return raised;
}
