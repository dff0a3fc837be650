/**
 * Tier limits through cgroup v1. Each desktop gets `canto/<desktopId>` under the memory, cpu and
 * pids hierarchies. Processes are placed in the groups by a tiny shell prologue that writes its
 * own pid into `cgroup.procs` and then execs the real program (see joinArgv; it is the one way in,
 * for warm servers and exec's relay too), so every process of a desktop — bwrap, CRIU's restored tree, exec'd commands — is
 * inside the groups from its first instruction and no fork can race past the limits.
 */
import { mkdir, readdir, readFile, rmdir, statfs, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { TIER_SPECS, type Tier } from '../../../../../shared/src/tiers.js';
import { AgentFailure } from '../../../../../shared/src/protocol.js';
import { guestFile } from '../guest/guest-programs.js';
import { signal, waitFor } from './host-procs.js';
import { helperPath } from './spawner.js';

const CONTROLLERS = ['memory', 'cpu', 'pids'] as const;
const CGROUP_ROOT = '/sys/fs/cgroup';

/**
 * `sh -c JOIN canto-join <n> <dir>... <program> <args>...` (agent/guest/cgroup-join.sh): join n
 * cgroup directories, then exec the program. Exits 97, saying this, when a group cannot be joined,
 * so nothing runs unlimited.
 */
export const JOIN_FAILED = 'canto: cannot join cgroup';


/** `statfs`'s type of a cgroup v1 hierarchy (CGROUP_SUPER_MAGIC). */
const CGROUP_V1 = 0x27e0eb;

/**
 * Why this host cannot give desktops their tier limits, or null: each controller must be a
 * cgroup v1 hierarchy at `<root>/<controller>`. On a host booted with the unified (v2) hierarchy
 * the agent used to start, link and take desktops, and then fail every boot.
 */
export async function cgroupV1Problem(root = CGROUP_ROOT): Promise<string | null> {
  const missing: string[] = [];
  for (const controller of CONTROLLERS) {
    const fs = await statfs(join(root, controller)).catch(() => null);
    if (fs?.type !== CGROUP_V1) missing.push(controller);
  }
  if (missing.length === 0) return null;
  return `the sandbox runtime needs cgroup v1: no ${missing.join(', ')} hierarchy at ${root}/<controller> `
    + '(a host on the unified hierarchy boots with systemd.unified_cgroup_hierarchy=0 on its kernel command line)';
}

export function cgroupDirs(desktopId: string): string[] {
  return CONTROLLERS.map((c) => join(CGROUP_ROOT, c, 'canto', desktopId));
}

/**
 * The argv prefix (for `/bin/sh`) that runs a program inside the desktop's groups. A program the
 * agent starts with Node's spawn names `firstStray`, its first descriptor not handed on on purpose
 * (3 when it has only stdio): the spawner's `--clean` mode then keeps what the agent inherited
 * from reaching the desktop (agent/native/clean-fds.c). The spawner's own children need not.
 */
export function joinArgv(desktopId: string, firstStray?: number): string[] {
  const dirs = cgroupDirs(desktopId);
  const cleaner = firstStray === undefined ? null : helperPath();
  const clean = cleaner === null ? [] : [cleaner, '--clean', String(firstStray)];
  return ['-c', guestFile('cgroup-join.sh'), 'canto-join', String(dirs.length), ...dirs, ...clean];
}

/**
 * The running desktops among those under `desktopsDir`, and the memory of every desktop on the
 * machine, in three reads whatever their number: a desktop runs while its groups exist (made by
 * `applyTier` at start, removed once its processes are gone), and the parent `canto` memory group
 * is charged for all of its children (cgroup v1 memory is hierarchical on this kernel). The
 * memory is the machine's: several agents on one machine (tests) each report the same total.
 */
export async function desktopUsage(desktopsDir: string): Promise<{ running: number; memoryBytes: number }> {
  const [held, groups, usage] = await Promise.all([
    readdir(desktopsDir).catch(() => [] as string[]),
    readdir(join(CGROUP_ROOT, 'pids', 'canto')).catch(() => [] as string[]),
    readFile(join(CGROUP_ROOT, 'memory', 'canto', 'memory.usage_in_bytes'), 'utf8').catch(() => '0'),
  ]);
  const running = new Set(groups);
  return { running: held.filter((id) => running.has(id)).length, memoryBytes: Number(usage.trim()) || 0 };
}

/** Creates the groups (idempotent) and writes the tier's limits. */
export async function applyTier(desktopId: string, tier: Tier): Promise<void> {
  const spec = TIER_SPECS[tier];
  const [memory, cpu, pids] = cgroupDirs(desktopId) as [string, string, string];
  try {
    for (const dir of [memory, cpu, pids]) await mkdir(dir, { recursive: true });
    await writeFile(join(memory, 'memory.limit_in_bytes'), String(spec.memoryMb * 1024 * 1024));
    const period = Number((await readFile(join(cpu, 'cpu.cfs_period_us'), 'utf8')).trim());
    await writeFile(join(cpu, 'cpu.cfs_quota_us'), String(spec.vcpus * period));
    await writeFile(join(pids, 'pids.max'), String(spec.maxPids));
  } catch (err) {
    throw new AgentFailure('runtime_error', `cannot set up cgroups for ${desktopId}: ${String(err)}`, true);
  }
}

export async function cgroupPids(desktopId: string): Promise<number[]> {
  const pidsDir = cgroupDirs(desktopId)[2] as string;
  try {
    const text = await readFile(join(pidsDir, 'cgroup.procs'), 'utf8');
    return text.split('\n').filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

/**
 * Waits for the groups to empty (after a dump or after the guest init was killed), SIGKILLs any
 * straggler after `graceMs`, then removes the groups. Returns false if they could not be removed.
 */
export async function drainAndRemove(desktopId: string, graceMs: number): Promise<boolean> {
  const empty = async () => (await cgroupPids(desktopId)).length === 0;
  if (!(await waitFor(empty, graceMs))) {
    for (const pid of await cgroupPids(desktopId)) signal(pid, 'SIGKILL');
    await waitFor(empty, 5_000);
  }
  let ok = true;
  for (const dir of cgroupDirs(desktopId)) {
    try {
      await rmdir(dir);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') ok = false;
    }
  }
  return ok;
}

/**
 * Removes the groups if nothing runs in them, and leaves them otherwise. For a desktop that is not
 * running here: its groups are named by desktop id alone, machine-wide, so when a second agent on
 * the same machine runs that desktop now (it was moved there), they hold its processes, which are
 * not this agent's to kill.
 */
export async function removeIfEmpty(desktopId: string): Promise<void> {
  for (const dir of cgroupDirs(desktopId)) {
    await rmdir(dir).catch(() => undefined);
  }
}
