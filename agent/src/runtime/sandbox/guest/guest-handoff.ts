/**
 * File handoff: the bytes of a large read or of a replacing write move between the agent and the
 * guest's file directly, instead of through the guest helper's pipe or socket.
 *
 * The helper still does everything that involves a guest path: it resolves the path inside the
 * guest's mount namespace and root, checks it, and opens the file (or, for a write, the anonymous
 * temporary that becomes the file). It then tells the agent its pid inside the guest and the
 * descriptor's number, and the agent opens `/proc/<host pid>/fd/<n>`. That link is not a path: it
 * reopens the inode the helper holds, so no guest symlink or mount is consulted. Moving 8 MiB this
 * way costs one copy in the agent instead of the helper's reads and writes plus a socket hop.
 *
 * What the agent trusts is only what it checks itself. The helper runs inside the guest, where
 * guest root could tamper with it, so the host pid is found among the descendants of the process
 * the agent started for the call, it must sit in the guest's pid namespace, and it must be the same
 * process (start time, namespace) after the open as before; the descriptor must be a regular file
 * with the device and inode the helper named, and on no kernel filesystem (procfs, sysfs and the
 * like, whose "regular files" are the kernel's: /proc/kcore, a process's oom_score_adj), which the
 * helper refuses too. The worst a tampered helper can therefore arrange is a different regular
 * file of the guest's own disk that the guest itself holds open: nothing the guest could not read
 * or write anyway. Flags never include O_CREAT or O_TRUNC, and O_NONBLOCK keeps a FIFO from blocking.
 */
import { closeSync, constants as fsc, fstatSync, openSync, read, readFileSync, readlinkSync, statfsSync, writev } from 'node:fs';
import { AgentFailure } from '../../../../../shared/src/protocol.js';
import { childPidsSync, procStatSync } from '../host/host-procs.js';

export interface HandedFile {
  /** The helper's pid inside the guest. */
  readonly guestPid: number;
  /** The descriptor number in the helper. */
  readonly fd: number;
  /** Device and inode as the helper's fstat saw them. */
  readonly dev: bigint;
  readonly ino: bigint;
}

export interface HandoffScope {
  /** The host process the agent started for the call; the helper descends from it. */
  readonly root: number;
  /** The guest init's host pid, whose pid namespace the helper must be in. */
  readonly initPid: number;
}

/**
 * `statfs` types of filesystems whose files are the kernel's interfaces or memory, not a disk's
 * data (linux/magic.h): proc, sysfs, debugfs, tracefs, securityfs, cgroup, cgroup2, bpf, configfs,
 * pstore, efivarfs, fusectl, binfmt_misc, selinuxfs, smackfs, and mqueue (its "regular files"
 * are message queues) and hugetlbfs (huge-page memory), whose files also read as regular.
 */
const KERNEL_FS = new Set<bigint>([
  0x9fa0n, 0x62656572n, 0x64626720n, 0x74726163n, 0x73636673n, 0x27e0ebn, 0x63677270n, 0xcafe4a11n,
  0x62656570n, 0x6165676cn, 0xde5e81e4n, 0x65735543n, 0x42494e4dn, 0xf97cff8cn, 0x43415d53n,
  0x19800202n, 0x958458f6n,
]);

function refused(why: string): AgentFailure {
  return new AgentFailure('runtime_error', `guest helper handoff refused: ${why}`, true);
}

/** Parses the helper's `<pid> <fd> <dev> <ino>` fields. */
export function parseHandedFile(fields: readonly (string | undefined)[]): HandedFile {
  const [pid, fd, dev, ino] = fields;
  const ok = [pid, fd, dev, ino].every((f) => f !== undefined && /^[0-9]{1,20}$/.test(f));
  if (!ok) throw new AgentFailure('runtime_error', 'guest helper sent a malformed reply', true);
  const guestPid = Number(pid);
  const n = Number(fd);
  if (!Number.isSafeInteger(guestPid) || guestPid < 1 || !Number.isSafeInteger(n) || n > 1 << 20) {
    throw new AgentFailure('runtime_error', 'guest helper sent a malformed reply', true);
  }
  return { guestPid, fd: n, dev: BigInt(dev as string), ino: BigInt(ino as string) };
}

function pidNamespace(pid: number): string | null {
  try {
    return readlinkSync(`/proc/${pid}/ns/pid`);
  } catch {
    return null;
  }
}

/** `(start time, pid namespace)` of a live host pid, or null when it is gone. */
function identity(pid: number): string | null {
  const st = procStatSync(pid);
  const ns = pidNamespace(pid);
  return st === null || ns === null ? null : `${st.startTime} ${ns}`;
}

/** The innermost pid in `/proc/<pid>/status`'s NSpid line, and how many namespaces it lists. */
function innermostPid(pid: number): { pid: number; depth: number } | null {
  try {
    const status = readFileSync(`/proc/${pid}/status`, 'latin1');
    const line = /^NSpid:\s+(.*)$/m.exec(status)?.[1];
    if (line === undefined) return null;
    const pids = line.trim().split(/\s+/).map(Number);
    return { pid: pids[pids.length - 1] as number, depth: pids.length };
  } catch {
    return null;
  }
}

/**
 * The host pid of the helper with `guestPid`, among the descendants of `scope.root`. Read
 * synchronously: procfs answers from memory, and a walk through the thread pool costs a round
 * trip per process, which a small write would feel.
 */
function hostPidOf(scope: HandoffScope, guestPid: number): number {
  const queue = [scope.root];
  for (let seen = 0; queue.length > 0 && seen < MAX_TREE; seen++) {
    const pid = queue.shift() as number;
    if (pid !== scope.root) {
      const inner = innermostPid(pid);
      if (inner !== null && inner.depth > 1 && inner.pid === guestPid) return pid;
    }
    queue.push(...childPidsSync(pid));
  }
  throw refused('the helper is not among the processes of this call');
}

/** A warm server has a handful of children; a tree this big is not one of ours. */
const MAX_TREE = 256;

/**
 * The agent's descriptor of a handed-off file. Reads and writes go through the thread pool; the
 * open and the close are synchronous, like the procfs checks around them: the file is on the
 * desktop's local disk and already open in the helper, so neither waits on anything.
 */
export class HandedFd {
  private closing = false;
  private released = false;
  private pending = 0;

  constructor(private readonly fd: number) {}

  read(buffer: Buffer, position: number): Promise<number> {
    return this.op((done) => read(this.fd, buffer, 0, buffer.length, position, done));
  }

  writev(buffers: Buffer[], position: number): Promise<number> {
    return this.op((done) => writev(this.fd, buffers, position, done));
  }

  /**
   * Idempotent. The number is released only once no read or write is queued in the thread pool:
   * released earlier, it could be reused by another open and a queued write would land there.
   */
  close(): void {
    this.closing = true;
    this.release();
  }

  private op(start: (done: (err: NodeJS.ErrnoException | null, n: number) => void) => void): Promise<number> {
    return new Promise((resolve, reject) => {
      if (this.closing) return reject(new Error('handed-off file is closed'));
      this.pending++;
      start((err, n) => {
        this.pending--;
        this.release();
        if (err) reject(err);
        else resolve(n);
      });
    });
  }

  private release(): void {
    if (!this.closing || this.released || this.pending > 0) return;
    this.released = true;
    closeSync(this.fd);
  }
}

/** Opens the file the helper holds, after the checks described above. The caller must close it. */
export function openHandedFile(scope: HandoffScope, file: HandedFile, mode: 'read' | 'write'): HandedFd {
  const pid = hostPidOf(scope, file.guestPid);
  const guestNs = pidNamespace(scope.initPid);
  const before = identity(pid);
  if (guestNs === null || before === null || !before.endsWith(` ${guestNs}`)) {
    throw refused('the helper is not in the desktop');
  }
  const flags = (mode === 'read' ? fsc.O_RDONLY : fsc.O_WRONLY) | fsc.O_NONBLOCK | fsc.O_NOCTTY;
  let fd: number;
  try {
    fd = openSync(`/proc/${pid}/fd/${file.fd}`, flags);
  } catch (err) {
    throw refused(`cannot open the descriptor (${(err as NodeJS.ErrnoException).code ?? String(err)})`);
  }
  try {
    const st = fstatSync(fd, { bigint: true });
    if (!st.isFile()) throw refused('not a regular file');
    if (st.dev !== file.dev || st.ino !== file.ino) throw refused('not the file the helper opened');
    // The agent's own descriptor table names the open file: no path of the guest's is walked.
    if (KERNEL_FS.has(statfsSync(`/proc/self/fd/${fd}`, { bigint: true }).type)) throw refused('a file of a kernel filesystem');
    if (identity(pid) !== before) throw refused('the helper changed during the open');
    return new HandedFd(fd);
  } catch (err) {
    closeSync(fd);
    throw err;
  }
}

/**
 * Writes a stream of chunks to a handed-off file in order, batching what arrives while a write is
 * in flight into one writev(2). Chunks arrive from the link faster than one write per chunk
 * (a thread-pool round trip each) can take them; batching keeps the queue from growing to the
 * whole upload, which would hold every chunk in memory long enough to cost full garbage
 * collections.
 */
export class BatchedWriter {
  private queue: Buffer[] = [];
  private at = 0;
  private running: Promise<void> | null = null;
  private error: unknown = null;

  constructor(private readonly handle: HandedFd) {}

  /** Queues `chunk`; throws the error of an earlier write, if one failed. */
  write(chunk: Buffer): void {
    if (this.error !== null) throw this.error;
    if (chunk.length === 0) return;
    this.queue.push(chunk);
    this.running ??= this.drain();
  }

  /** Resolves when everything queued is written; rejects with the first write error. */
  async flush(): Promise<void> {
    while (this.running !== null) await this.running;
    if (this.error !== null) throw this.error;
  }

  private async drain(): Promise<void> {
    try {
      while (this.queue.length > 0 && this.error === null) {
        let batch = this.queue;
        this.queue = [];
        while (batch.length > 0) {
          const bytesWritten = await this.handle.writev(batch, this.at);
          this.at += bytesWritten;
          batch = remainder(batch, bytesWritten);
        }
      }
    } catch (err) {
      this.error = err;
      this.queue = [];
    } finally {
      this.running = null;
    }
  }
}

/** What is left of `buffers` after the first `written` bytes. */
function remainder(buffers: Buffer[], written: number): Buffer[] {
  let skip = written;
  let i = 0;
  while (i < buffers.length && skip >= (buffers[i] as Buffer).length) skip -= (buffers[i++] as Buffer).length;
  const rest = buffers.slice(i);
  if (rest.length > 0 && skip > 0) rest[0] = (rest[0] as Buffer).subarray(skip);
  return rest;
}
