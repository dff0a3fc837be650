/**
 * Host-side process bookkeeping. A desktop outlives the agent, so the driver identifies the guest
 * init by (host pid, kernel start time) rather than by a child handle: the pair survives an agent
 * restart and cannot be confused with an unrelated process that later reuses the pid.
 */
import { existsSync, readFileSync } from 'node:fs';
import { readdir, readFile, readlink } from 'node:fs/promises';

export interface ProcStat {
  readonly pid: number;
  readonly ppid: number;
  readonly pgid: number;
  readonly session: number;
  /** Start time in clock ticks since boot (field 22 of /proc/PID/stat). */
  readonly startTime: string;
}

/** Parses /proc/PID/stat; the command name may contain spaces and parentheses, so split after ')'. */
export async function procStat(pid: number): Promise<ProcStat | null> {
  let text: string;
  try {
    text = await readFile(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return null;
  }
  return parseStat(pid, text);
}

/** Task flag of a process that is exiting (include/linux/sched.h). */
const PF_EXITING = 0x4;

/**
 * A process that is exiting counts as gone, as a zombie does. Its /proc entry can outlive its kill
 * by seconds: a guest init killed with its desktop's process tree waits in its exit until every
 * process of its pid namespace has died. Counted as running meanwhile, a desktop killed with a
 * crashed `canto up` read as running to the next agent's first look, and stayed recorded awake.
 */
function parseStat(pid: number, text: string): ProcStat | null {
  const rest = text.slice(text.lastIndexOf(')') + 2).split(' ');
  // rest[0] is field 3 (state); field N is rest[N - 3] (field 9: the task's flags).
  if (rest[0] === 'Z' || rest[0] === 'X' || (Number(rest[6]) & PF_EXITING) !== 0) return null;
  return {
    pid,
    ppid: Number(rest[1]),
    pgid: Number(rest[2]),
    session: Number(rest[3]),
    startTime: rest[19] ?? '',
  };
}

/** The process's arguments (/proc/PID/cmdline split at NULs), or null when it is gone. */
export async function commandLine(pid: number): Promise<string[] | null> {
  try {
    const raw = await readFile(`/proc/${pid}/cmdline`, 'utf8');
    return raw.endsWith('\0') ? raw.slice(0, -1).split('\0') : raw.split('\0');
  } catch {
    return null;
  }
}

export async function isSameProcess(pid: number, startTime: string): Promise<boolean> {
  const st = await procStat(pid);
  return st !== null && st.startTime === startTime;
}

/**
 * procStat, synchronously, for the path of every guest operation: a /proc file is made up by the
 * kernel on read and never blocks, and a trip through the thread pool costs more than it.
 */
export function procStatSync(pid: number): ProcStat | null {
  try {
    return parseStat(pid, readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return null;
  }
}

export function isSameProcessSync(pid: number, startTime: string): boolean {
  return procStatSync(pid)?.startTime === startTime;
}

export async function allProcs(): Promise<ProcStat[]> {
  const names = await readdir('/proc');
  const stats = await Promise.all(
    names.filter((n) => /^\d+$/.test(n)).map((n) => procStat(Number(n))),
  );
  return stats.filter((s): s is ProcStat => s !== null);
}

/**
 * SIGKILLs every process of a session (an exec'd command and whatever it left behind), looked for
 * among `among` (the processes of the session's desktop) or, when null, among all the host's.
 */
export async function killSession(session: number, among: readonly number[] | null = null): Promise<void> {
  const candidates = among === null ? await allProcs() : among.map(procStatSync).filter((s): s is ProcStat => s !== null);
  for (const p of candidates) {
    if (p.session === session) signal(p.pid, 'SIGKILL');
  }
}

/**
 * The processes in the same desktop's groups as `pid` (its pids cgroup under `canto/`), or null
 * when it is in none. A guest process cannot leave its desktop's groups, so a session inside the
 * guest has all its members there: searching them instead of the whole host keeps a kill's cost
 * bounded by the desktop, not by the host's thousands of processes.
 */
export function desktopPeers(pid: number): number[] | null {
  const path = /^\d+:pids:(\/canto\/[^/\n]+)$/m.exec(readOrNull(() => readFileSync(`/proc/${pid}/cgroup`, 'utf8')) ?? '')?.[1];
  if (path === undefined) return null;
  const procs = readOrNull(() => readFileSync(`/sys/fs/cgroup/pids${path}/cgroup.procs`, 'utf8'));
  return procs === null ? null : procs.split('\n').filter(Boolean).map(Number);
}

/**
 * SIGKILLs a process, its descendants, and every session one of its descendants leads: the
 * command's session inside the guest includes background jobs already reparented to the guest init.
 *
 * The part inside the guest goes first, and the host side (nsenter, the usual root) only once that
 * part has been reaped or REAPED_MS has passed. Killed together, nsenter dies before it can reap
 * its child in the guest, which the kernel then hands to the host's init, not the guest's: the
 * guest's pid namespace cannot end until that init reaps it, and a memory snapshot's dump waits
 * for the namespace to end. A host init that reaps once a second (as on some VMs) made every
 * hibernate with a terminal open take 1.2-1.9 s instead of 0.1.
 */
export async function killTree(root: number): Promise<void> {
  const rootStat = await procStat(root);
  const tree = await processTree(root);
  const sessions = new Set<number>();
  for (const pid of tree) {
    const st = await procStat(pid);
    if (st !== null && st.session === pid && st.session !== rootStat?.session) sessions.add(pid);
  }
  // Read before anything dies: a killed process's cgroup file no longer names its groups.
  const peers = sessions.size > 0 ? desktopPeers(root) : null;
  const own = await pidNamespace('self');
  const guest: number[] = [];
  const host: number[] = [];
  for (const pid of tree) ((await pidNamespace(pid)) === own ? host : guest).push(pid);
  for (const pid of guest) signal(pid, 'SIGKILL');
  for (const s of sessions) await killSession(s, peers);
  if (guest.length > 0 && host.length > 0) {
    // nsenter stops itself when its child stops (to pass the stop on), and a stopped nsenter
    // cannot reap: it goes on, to be killed next.
    for (const pid of host) signal(pid, 'SIGCONT');
    await waitFor(() => guest.every((pid) => !existsSync(`/proc/${pid}`)), REAPED_MS);
  }
  for (const pid of host) signal(pid, 'SIGKILL');
}

/** How long killTree lets the host side of a tree reap its guest side before killing it too. */
const REAPED_MS = 500;

/** The pid namespace a process is in (its `ns/pid` link); null once it is gone. */
async function pidNamespace(pid: number | 'self'): Promise<string | null> {
  return readlink(`/proc/${pid}/ns/pid`).catch(() => null);
}

/** A process and all its descendants, parents before children. */
export async function processTree(root: number): Promise<number[]> {
  const tree: number[] = [];
  const queue = [root];
  while (queue.length > 0) {
    const pid = queue.shift() as number;
    tree.push(pid);
    queue.push(...childPidsSync(pid));
  }
  return tree;
}

/**
 * The children of `pid`. Their `children` file is not a snapshot: each entry is looked up after the
 * one shown before it, and when that one has been reaped meanwhile the kernel counts its way back
 * by position in a list that just lost an element, skipping the entry after it (proc(5): reliable
 * only while the process is stopped). A child that was there all along can therefore be missing
 * from one read. A read equal to the next one cannot have skipped: the reaped entry it showed
 * would be absent from the next. So the file is read until two reads agree. Synchronously: procfs
 * answers from memory (see procStatSync), and a read through the thread pool lets more churn in
 * between two reads.
 */
export function childPidsSync(pid: number): number[] {
  let last: string | null = null;
  for (let i = 0; i < CHILDREN_READS; i++) {
    const text = readOrNull(() => readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8'));
    if (text === last || text === null) break;
    last = text;
  }
  return (last ?? '').split(' ').filter(Boolean).map(Number);
}

/**
 * A parent that forks and reaps without pause could keep any two reads apart; past this many the
 * last read is taken as it is, which is what a single read was.
 */
const CHILDREN_READS = 8;

/** What `read` gives, or null when it throws (a process or descriptor gone meanwhile). */
function readOrNull<T>(read: () => T): T | null {
  try {
    return read();
  } catch {
    return null;
  }
}

export function signal(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig);
  } catch {
    // Already gone: the goal is reached.
  }
}

/** Polls `check` until it returns true or the deadline passes; returns the last result. */
export async function waitFor(
  check: () => Promise<boolean> | boolean,
  timeoutMs: number,
  intervalMs = 5,
): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await check()) return true;
    if (Date.now() >= deadline) return false;
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}
