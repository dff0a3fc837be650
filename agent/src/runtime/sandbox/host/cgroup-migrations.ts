/**
 * How fast a process moves into a cgroup on this host. Every cold guest call, every restore's
 * keeper, every port relay and every boot starts with such a move (cgroups.ts: written into the
 * desktop's `cgroup.procs`), and the kernel makes each one take its cgroup_threadgroup_rwsem for
 * writing. Unless the cgroup roots favour dynamic modifications (`favordynmods`), that write lock
 * waits for an RCU grace period first, which on an idle host is a scheduler tick or more: here the
 * first write to `cgroup.procs` after 50 ms of quiet took 15 ms, against 20 µs back to back, and a
 * cold exec took 12-14 ms instead of 4. With `favordynmods` the readers of that lock (fork, exit)
 * take a slightly slower path instead, which suits a host that moves processes all day.
 *
 * At the driver's start the agent turns it on where it can (`CANTO_AGENT_CGROUP_FAVOR_DYNMODS`,
 * default `true`): if no cgroup mount has it, the cgroup2 mount is remounted with it, keeping the
 * options it has. The mode is the kernel's, for the whole host, and on current kernels it stays
 * on until a reboot (a later remount without it does not turn it off). Without a cgroup2 mount, or
 * on a kernel without the option (before 6.0), nothing changes and the agent says how to set it
 * at boot (`cgroup_favordynmods=true` on the kernel command line).
 */
import { readFile } from 'node:fs/promises';
import { parseMountTable, type Mount } from './mount-table.js';
import { runToEnd } from './spawner.js';

export type MigrationMode =
  /** A cgroup mount already had `favordynmods`. */
  | 'already'
  /** The agent remounted the cgroup2 mount with it. */
  | 'set'
  /** Turned off by the setting: the host is left as it is. */
  | 'off'
  /** Neither: moves wait for a grace period. */
  | 'unavailable';

/** The cgroup filesystems of a `/proc/self/mountinfo` text. */
export function cgroupMounts(mountinfo: string): Mount[] {
  return parseMountTable(mountinfo).filter((m) => m.fsType === 'cgroup' || m.fsType === 'cgroup2');
}

/**
 * What to do for `mounts`: nothing (one has the option already), or the remount of the cgroup2
 * mount as `mount` arguments, its own options kept (a cgroup2 remount resets those it is not given).
 */
export function favorDynmodsPlan(mounts: readonly Mount[]): { already: true } | { already: false; remount: string[] | null } {
  if (mounts.some((m) => m.superOptions.includes('favordynmods'))) return { already: true };
  const v2 = mounts.find((m) => m.fsType === 'cgroup2');
  if (v2 === undefined) return { already: false, remount: null };
  const kept = v2.superOptions.filter((o) => o !== 'rw' && o !== 'ro');
  return { already: false, remount: ['-o', ['remount', ...kept, 'favordynmods'].join(','), v2.mountPoint] };
}

/** Turns `favordynmods` on where it is off and can be (see the module comment); says what it found. */
export async function favorDynamicCgroups(enabled: boolean, log: (msg: string, fields?: object) => void): Promise<MigrationMode> {
  if (!enabled) return 'off';
  const read = async () => cgroupMounts(await readFile('/proc/self/mountinfo', 'utf8').catch(() => ''));
  const plan = favorDynmodsPlan(await read());
  if (plan.already) return 'already';
  const advice = 'moving a process into a cgroup waits for an RCU grace period (10-15 ms on an idle host); boot with cgroup_favordynmods=true to avoid it';
  if (plan.remount === null) {
    log('no cgroup2 mount to turn favordynmods on', { advice });
    return 'unavailable';
  }
  const { code, stderr } = await runToEnd('mount', plan.remount, { timeoutMs: 10_000 });
  if (code === 0 && favorDynmodsPlan(await read()).already) {
    log('cgroup roots now favour dynamic modifications (favordynmods)', { mount: plan.remount.at(-1) });
    return 'set';
  }
  log('could not turn favordynmods on', { error: stderr || `mount exited with ${String(code)}`, advice });
  return 'unavailable';
}
