/**
 * A new guest's /proc/sys and the other parts of /proc that act on the whole host, each bound
 * onto itself read-only before the guest's first instruction (agent/native/proc-seal.c says why:
 * uid 0 writes a sysctl by its file mode alone, and one of them, `kernel.core_pattern`, makes the
 * kernel run a file of the guest's choosing as the host's root; /proc/sysrq-trigger reboots the
 * host). bwrap waits on its block fd meanwhile (cold-boot.ts). The spawner binary does it in one
 * process where it is built; otherwise nsenter and a shell's mounts do, with the same result.
 */

/** Docker's read-only paths of /proc; the same list as proc-seal.c's. */
export const SEALED_PROC_PATHS = ['/proc/sys', '/proc/sysrq-trigger', '/proc/irq', '/proc/bus', '/proc/fs', '/proc/acpi', '/proc/scsi'] as const;
import { readFile } from 'node:fs/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import { AgentFailure } from '../../../../../shared/src/protocol.js';
import { helperPath, runToEnd } from './spawner.js';

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
export async function untilBlockedOn(pid: number, fd: number, desktopId: string): Promise<void> {
  const read = READ_SYSCALL[process.arch];
  if (read === undefined) throw new AgentFailure('unsupported', `sealing a guest's /proc is not known on ${process.arch}`, false);
  const deadline = performance.now() + BLOCK_WAIT_MS;
  for (;;) {
    const text = await readFile(`/proc/${pid}/syscall`, 'utf8').catch(() => null);
    if (text === null) throw failure(desktopId, 'bwrap ended before the guest started');
    const [nr, first] = text.split(' ');
    if (Number(nr) === read && Number(first) === fd) return;
    if (performance.now() > deadline) throw failure(desktopId, `bwrap did not reach its block fd in ${BLOCK_WAIT_MS} ms (${text.trim()})`);
    await sleep(1);
  }
}

/**
 * Seals the /proc of `pid`'s mount namespace, once `pid` waits for it (untilBlockedOn);
 * `helper` is the spawner binary (tests pass null for the chain).
 */
export async function sealProcSys(pid: number, nsenterPath: string, desktopId: string, helper = helperPath()): Promise<void> {
  const native = helper === null ? null : await runToEnd(helper, ['--seal-proc', String(pid)], { timeoutMs: 10_000 });
  // 2: a binary from a build without this mode (its usage); the chain then does it.
  if (native !== null && native.code === 0) return;
  if (native !== null && native.code !== 2) throw failure(desktopId, native.stderr);
  const chain = await runToEnd(nsenterPath, [
    '-t', String(pid), '-m', '-r', '--',
    '/bin/sh', '-c', 'for p; do [ -e "$p" ] || continue; mount --bind "$p" "$p" && mount -o remount,bind,ro,nosuid,nodev,noexec "$p" || exit 1; done',
    'canto-seal', ...SEALED_PROC_PATHS,
  ], { timeoutMs: 10_000 });
  if (chain.code !== 0) throw failure(desktopId, chain.stderr);
}

function failure(desktopId: string, stderr: string): AgentFailure {
  return new AgentFailure('runtime_error', `desktop ${desktopId} failed to boot: its /proc could not be made read-only (${stderr.trim().split('\n').at(-1) ?? 'no reason given'})`, true);
}
