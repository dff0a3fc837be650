/**
 * A new guest's /proc/sys and the other parts of /proc that act on the whole host, each bound
 * onto itself read-only before the guest's first instruction (agent/native/proc-seal.c says why:
 * uid 0 writes a sysctl by its file mode alone, and one of them, `kernel.core_pattern`, makes the
 * kernel run a file of the guest's choosing as the host's root; /proc/sysrq-trigger reboots the
 * host). bwrap waits on its block fd meanwhile (cold-boot.ts), and the guest init refuses to go on
 * if it finds any of them writable (agent/guest/init.sh), since bwrap starts the guest whatever
 * its block fd says. The spawner binary does it in one process where it is built; otherwise, at a
 * boot, nsenter and a shell's mounts do, with the same result.
 */
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import { AgentFailure } from '../../../../../shared/src/protocol.js';
import { helperPath, runToEnd } from './spawner.js';
import { parseMountTable } from './mount-table.js';

/** Docker's read-only paths of /proc and the other writable ones that act on the whole host: what the seal binds read-only. */
export const SEALED_PROC_PATHS = [
  '/proc/sys', '/proc/sysrq-trigger', '/proc/irq', '/proc/bus', '/proc/fs', '/proc/acpi', '/proc/scsi',
  '/proc/dynamic_debug', '/proc/latency_stats', '/proc/timer_stats', '/proc/asound', '/proc/driver',
] as const;

/** `read` on this architecture: what bwrap's child is in while it waits on its block fd. */
const READ_SYSCALL: Readonly<Record<string, number>> = { x64: 0, arm64: 63 };
/** How long bwrap may take to make the guest's mounts and reach its block fd. */
const BLOCK_WAIT_MS = 10_000;

/**
 * Until `pid` waits in `read` on descriptor `fd`: bwrap's child once it has made the guest's
 * mounts. bwrap reports the child's pid (its info fd) as soon as it has cloned it, before any
 * mount: a seal made then would sit under the /proc bwrap mounts next, or fail on a root about to
 * be pivoted away. The kernel shows a process's current system call and its arguments in
 * /proc/<pid>/syscall.
 */
export async function untilBlockedOn(pid: number, fd: number, desktopId: string, bootLog = 'boot.log'): Promise<void> {
  const read = READ_SYSCALL[process.arch];
  if (read === undefined) throw new AgentFailure('unsupported', `sealing a guest's /proc is not known on ${process.arch}`, false);
  const deadline = performance.now() + BLOCK_WAIT_MS;
  for (;;) {
    const text = await readFile(`/proc/${pid}/syscall`, 'utf8').catch((err: NodeJS.ErrnoException) => err);
    if (text instanceof Error) {
      // Gone: bwrap failed while it set the guest up, and says why in the boot log.
      if (!existsSync(`/proc/${pid}`)) throw new AgentFailure('runtime_error', `desktop ${desktopId} failed to boot: bwrap ended before the guest started; see ${bootLog}`, true);
      throw failure(desktopId, `/proc/${pid}/syscall cannot be read (${text.code ?? text.message}; kernel.yama.ptrace_scope=3 forbids it)`);
    }
    const [nr, first] = text.split(' ');
    if (Number(nr) === read && Number(first) === fd) return;
    if (performance.now() > deadline) throw failure(desktopId, `bwrap did not reach its block fd in ${BLOCK_WAIT_MS} ms (${text.trim()}); see ${bootLog}`);
    await sleep(2);
  }
}

/**
 * Seals the /proc of `pid`'s mount namespace: a guest bwrap holds at its block fd
 * (untilBlockedOn), or with `running`, one already running (running-seal.ts), which only the
 * spawner binary seals (the chain would run programs in a namespace the guest has had time to
 * prepare). `helper` is the spawner binary (tests pass null for the chain).
 */
export async function sealProcSys(pid: number, nsenterPath: string, desktopId: string, helper = helperPath(), running = false): Promise<void> {
  const native = helper === null ? null : await runToEnd(helper, ['--seal-proc', String(pid), ...SEALED_PROC_PATHS], { timeoutMs: 5_000 });
  // 2: a binary from a build without this mode, or one that takes no paths (its usage); the chain then does it.
  if (native !== null && native.code === 0) return await sealed(pid, desktopId);
  if (native !== null && native.code !== 2) throw failure(desktopId, native.stderr);
  if (running) throw failure(desktopId, 'a running guest is sealed only by the spawner binary, which is not built here or is from an older build');
  // At the namespace's root (no --root: the init's own root is the guest's to move), which bwrap
  // made the guest's root, with /usr and /bin the host's, read-only.
  const chain = await runToEnd(nsenterPath, [
    '-t', String(pid), '-m', '--',
    '/bin/sh', '-c', 'for p; do [ -e "$p" ] || continue; mount --bind "$p" "$p" && mount -o remount,bind,ro,nosuid,nodev,noexec "$p" || exit 1; done',
    'canto-seal', ...SEALED_PROC_PATHS,
  ], { timeoutMs: 5_000 });
  if (chain.code !== 0) throw failure(desktopId, chain.stderr);
  await sealed(pid, desktopId);
}

/** Throws unless every path this kernel has is read-only for `pid` now: a binary of an older build seals a shorter list. */
async function sealed(pid: number, desktopId: string): Promise<void> {
  const missing = await unsealedProcPaths(pid);
  if (missing.length > 0) throw failure(desktopId, `still writable after the seal: ${missing.join(', ')}`);
}

/** The sealed paths this kernel has that `pid` does not see read-only. */
export async function unsealedProcPaths(pid: number): Promise<string[]> {
  const readOnly = new Set(await readOnlyProcPaths(pid));
  return SEALED_PROC_PATHS.filter((p) => existsSync(p) && !readOnly.has(p));
}

/** The sealed paths the guest of `pid` sees read-only (the last mount at a path is the one it sees). */
export async function readOnlyProcPaths(pid: number): Promise<string[]> {
  const readOnly = new Map<string, boolean>();
  for (const m of parseMountTable(await readFile(`/proc/${pid}/mountinfo`, 'utf8').catch(() => ''))) readOnly.set(m.mountPoint, m.mountOptions.includes('ro'));
  return SEALED_PROC_PATHS.filter((p) => readOnly.get(p) === true);
}

function failure(desktopId: string, reason: string): AgentFailure {
  return new AgentFailure('runtime_error', `desktop ${desktopId} failed to boot: its /proc could not be made read-only (${reason.trim().split('\n').at(-1) || 'no reason given'})`, true);
}
