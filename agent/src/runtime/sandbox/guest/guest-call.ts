/**
 * One call of the guest helper (guest-helper.ts): the process chain that enters a desktop, and the
 * agent's end of the helper's protocol.
 *
 * The chain is `sh` (joins the desktop's cgroups, then execs) → `nsenter -t <guest init> -m -u -i
 * -n -p -r` → [`setpriv` down to the guest's capabilities] → `perl`. The kernel therefore resolves
 * every path against the guest's mount namespace and root, and the helper counts against the
 * desktop's limits. The helper's stdio are the agent's own pipes: unlike exec, nothing it starts
 * may keep them (a detached process gets /dev/null and files), so no relay is needed, and data
 * streams straight between the agent and the guest without being held anywhere whole.
 *
 * When the desktop's warm file server is ready (warm-pool.ts), the call connects to it instead of
 * spawning: one of its children, at the end of that same chain inside the guest, takes the
 * operation as the first line of the connection, and everything after that is the same protocol
 * on the connection instead of on stdio. Calls that start guest code (`spawn`, with the guest's
 * capabilities and environment) always start cold: they are rare and not latency-bound.
 *
 * A call is registered with the desktop's in-flight set (in-flight.ts) so that hibernate and
 * destroy can wait for it or kill it; a call killed that way fails with `not_running`.
 */
import { PassThrough, type Readable, type Writable } from 'node:stream';
import { AgentFailure, type AgentErrorCode } from '../../../../../shared/src/protocol.js';
import { JOIN_FAILED } from '../host/cgroups.js';
import { ENTER_FAILED, enterArgv } from './guest-entry.js';
import { guestHelperProgram, helperRequest, type HelperOp } from './guest-helper.js';
import { GUEST_ENV, GUEST_PATH } from './guest-init.js';
import { killTree } from '../host/host-procs.js';
import { spawnProcess, type SpawnedProcess } from '../host/spawner.js';
import type { HandoffScope } from './guest-handoff.js';
import type { GuestOp } from './in-flight.js';
import type { WarmConnection } from '../host/warm-pool.js';

export interface GuestTarget {
  readonly desktopId: string;
  readonly initPid: number;
  readonly nsenterPath: string;
  /** The in-flight registration; null for the driver's own calls under the lifecycle mutex. */
  readonly op: GuestOp | null;
  /** A connection to the desktop's warm file server, if one is ready (null: start cold). */
  readonly warm?: () => Promise<WarmConnection | null>;
}

export interface CallOptions {
  /** Keep only the guest's capabilities: for calls that start guest code. */
  readonly guestCaps?: boolean;
  /** Deadline for the status line; null arms no timer (the caller arms one later). */
  readonly timeoutMs: number | null;
}

/** Codes the helper may answer with; anything else is a protocol error. */
const HELPER_CODES = new Set<string>(['path_missing', 'path_conflict', 'too_large', 'bad_request', 'runtime_error']);
/** The status line is short; a longer one means the helper is not speaking the protocol. */
const MAX_STATUS_LINE = 64 * 1024;
const STDERR_KEEP = 4 * 1024;

/** The two ends of a call: a cold helper's stdio, or a connection to a warm one. */
interface Channel {
  readonly stdin: Writable;
  readonly stdout: Readable;
  readonly stderr: Readable | null;
  /** Resolves when the helper is finished with (exited, or the connection closed). */
  readonly closed: Promise<void>;
  /** The host process started for the call, which the helper descends from. */
  readonly hostRoot: number | null;
  kill(): Promise<void>;
}

function coldChannel(child: SpawnedProcess): Channel {
  const closed = new Promise<void>((resolve) => {
    child.on('error', () => resolve());
    child.on('close', () => resolve());
  });
  return {
    stdin: child.stdin as Writable,
    stdout: child.stdout as Readable,
    stderr: child.stderr,
    closed,
    hostRoot: child.pid ?? null,
    kill: async () => {
      if (child.pid !== undefined && child.exitCode === null && child.signalCode === null) await killTree(child.pid);
    },
  };
}

/**
 * A connection is both ends. A helper may answer early and hang up on the rest of an upload; the
 * agent's next write then fails, and a failed write destroys the socket, read side and all. What
 * arrives is therefore moved out of the socket as it comes, so the answer outlives the socket;
 * backpressure still reaches the helper (the socket pauses while the consumer lags).
 *
 * Closing the connection is the kill: the child's next write fails (it exits on EPIPE) or its next
 * read ends (an upload without its end marker changes nothing). A recursive delete's rm may run on
 * until done; hibernate and destroy kill the server's whole group anyway.
 */
function warmChannel({ socket, serverPid }: WarmConnection): Channel {
  const stdout = new PassThrough();
  socket.on('data', (chunk: Buffer) => {
    if (!stdout.write(chunk)) socket.pause();
  });
  stdout.on('drain', () => socket.resume());
  socket.resume();
  const finish = () => {
    if (!stdout.writableEnded) stdout.end();
  };
  socket.once('end', finish);
  socket.once('close', finish);
  return {
    stdin: socket,
    stdout,
    stderr: null,
    closed: new Promise<void>((resolve) => socket.once('close', () => resolve())),
    hostRoot: serverPid,
    kill: async () => {
      socket.destroy();
    },
  };
}

export class GuestCall {
  readonly stdin: Writable;
  private readonly channel: Channel;
  private readonly it: AsyncIterator<Buffer>;
  private pending: Buffer = Buffer.alloc(0);
  private stderr = '';
  private timer: NodeJS.Timeout | undefined;
  private timedOut = false;
  private timeoutMs = 0;
  private readonly exited: Promise<void>;
  /** The helper is done: no deadline is armed any more (one armed now would never be cleared). */
  private finished = false;
  private readonly releases: Array<() => Promise<void>> = [];

  private constructor(
    private readonly target: GuestTarget,
    channel: Channel,
    opts: CallOptions,
  ) {
    this.channel = channel;
    this.stdin = channel.stdin;
    this.stdin.on('error', () => undefined);
    this.it = channel.stdout[Symbol.asyncIterator]();
    channel.stderr?.on('data', (chunk: Buffer) => {
      if (this.stderr.length < STDERR_KEEP) this.stderr += chunk.toString('utf8').slice(0, STDERR_KEEP);
    });
    this.exited = channel.closed;
    void this.exited.then(() => {
      this.finished = true;
      clearTimeout(this.timer);
      target.op?.end();
    });
    target.op?.attach(() => this.kill());
    if (opts.timeoutMs !== null) this.arm(opts.timeoutMs);
  }

  static async start(target: GuestTarget, op: HelperOp, args: readonly string[], opts: CallOptions): Promise<GuestCall> {
    if (target.op?.cancelled) throw stopping(target.desktopId);
    let channel: Channel | null = null;
    if (!opts.guestCaps && target.warm !== undefined) {
      const request = helperRequest(op, args);
      const warm = await target.warm();
      if (target.op?.cancelled) {
        warm?.socket.destroy();
        throw stopping(target.desktopId);
      }
      if (warm !== null) {
        warm.socket.write(request);
        channel = warmChannel(warm);
      }
    }
    channel ??= coldChannel(await spawnHelper(target, op, args, opts.guestCaps === true));
    // A stop while the helper was being started finds no call to kill: this one is killed here.
    if (target.op?.cancelled) {
      await channel.kill();
      throw stopping(target.desktopId);
    }
    return new GuestCall(target, channel, opts);
  }

  /** (Re)starts the deadline: when it passes, the helper is killed and the call fails with `timeout`. */
  arm(ms: number): void {
    clearTimeout(this.timer);
    if (this.finished) return;
    this.timeoutMs = ms;
    this.timer = setTimeout(() => {
      this.timedOut = true;
      void this.kill();
    }, ms);
  }

  /** Stops the deadline: the caller waits on something that has its own (an upload's sender). */
  disarm(): void {
    clearTimeout(this.timer);
  }

  /** Where the helper of this call runs, for a file handoff (guest-handoff.ts). */
  handoffScope(): HandoffScope {
    if (this.channel.hostRoot === null) throw new AgentFailure('runtime_error', 'guest helper did not start', true);
    return { root: this.channel.hostRoot, initPid: this.target.initPid };
  }

  /**
   * Runs `release` (closing a handed-off file) before the helper is killed, so that a stop that
   * kills this call leaves nothing of the guest open in the agent.
   */
  holdUntilKilled(release: () => Promise<void>): void {
    this.releases.push(release);
  }

  /** True once the helper has exited (or its connection closed): the call is over. */
  get isFinished(): boolean {
    return this.finished;
  }

  /** Resolves when the helper has exited (or its connection closed). */
  whenFinished(): Promise<void> {
    return this.exited;
  }

  /**
   * Kills the helper and drops what it sent and nobody read: the call counts as finished (and
   * leaves the in-flight set) only once its stdout is closed, which unread data would prevent.
   */
  async kill(): Promise<void> {
    await Promise.all(this.releases.splice(0).map((release) => release().catch(() => undefined)));
    await this.channel.kill();
    this.channel.stdout.destroy();
  }

  /** Writes to the helper's stdin; false once the helper is gone. Waits for the pipe to drain. */
  send(data: Buffer | string): Promise<boolean> {
    const stdin = this.stdin;
    if (stdin.destroyed || stdin.writableEnded) return Promise.resolve(false);
    if (stdin.write(data)) return Promise.resolve(true);
    return new Promise((resolve) => {
      const finish = (ok: boolean) => {
        stdin.off('drain', onDrain);
        stdin.off('close', onClose);
        resolve(ok);
      };
      const onDrain = () => finish(true);
      const onClose = () => finish(false);
      stdin.on('drain', onDrain);
      stdin.on('close', onClose);
    });
  }

  /** The fields of the helper's `OK` line; an `ERR` line or no line at all throws an AgentFailure. */
  async status(): Promise<string[]> {
    for (;;) {
      const nl = this.pending.indexOf(0x0a);
      if (nl >= 0) {
        const line = this.pending.subarray(0, nl).toString('utf8');
        this.pending = this.pending.subarray(nl + 1);
        return this.parseStatus(line);
      }
      if (this.pending.length > MAX_STATUS_LINE) {
        await this.kill();
        throw new AgentFailure('runtime_error', 'guest helper sent a malformed reply', true);
      }
      const chunk = await this.next();
      if (chunk === null) throw await this.noReply();
      this.pending = this.pending.length === 0 ? chunk : Buffer.concat([this.pending, chunk]);
    }
  }

  /** Everything after the status line, up to `max` bytes, then the deadline stops. */
  async rest(max: number): Promise<Buffer> {
    const parts = [this.pending];
    let size = this.pending.length;
    this.pending = Buffer.alloc(0);
    for (let chunk = await this.next(); chunk !== null; chunk = await this.next()) {
      size += chunk.length;
      if (size > max) {
        await this.kill();
        throw new AgentFailure('runtime_error', 'guest helper reply is too large', false);
      }
      parts.push(chunk);
    }
    if (this.timedOut) throw this.timeoutFailure();
    if (this.target.op?.cancelled) throw stopping(this.target.desktopId);
    clearTimeout(this.timer);
    return Buffer.concat(parts, size);
  }

  /**
   * Exactly `length` bytes after the status line, as they arrive. The deadline restarts at each
   * step with `idleMs`, so a consumer that stops pulling (or a helper that stops sending) ends the
   * call instead of leaving the helper blocked on a full pipe. Ending early kills the helper.
   */
  async *body(length: number, idleMs: number): AsyncGenerator<Buffer> {
    let remaining = length;
    let complete = false;
    try {
      let chunk: Buffer | null = this.pending;
      this.pending = Buffer.alloc(0);
      while (remaining > 0) {
        if (chunk === null) throw this.shortBody();
        if (chunk.length > 0) {
          const part = chunk.length > remaining ? chunk.subarray(0, remaining) : chunk;
          remaining -= part.length;
          this.arm(idleMs);
          yield part;
        }
        if (remaining > 0) {
          this.arm(idleMs);
          chunk = await this.next();
        }
      }
      complete = true;
      clearTimeout(this.timer);
    } finally {
      if (!complete) await this.kill();
    }
  }

  private async next(): Promise<Buffer | null> {
    try {
      const { value, done } = await this.it.next();
      return done ? null : (value as Buffer);
    } catch {
      return null;
    }
  }

  private parseStatus(line: string): string[] {
    const fields = line.split(' ');
    if (fields[0] === 'OK') return fields.slice(1);
    const match = /^ERR ([a-z_]+) ([0-9]+|-) (.*)$/.exec(line);
    if (match === null) throw new AgentFailure('runtime_error', 'guest helper sent a malformed reply', true);
    const [, code = '', size = '-', message = ''] = match;
    if (code === 'aborted') return fail('runtime_error', 'upload aborted');
    const known = HELPER_CODES.has(code) ? (code as AgentErrorCode) : 'runtime_error';
    throw new AgentFailure(known, message, false, size === '-' ? undefined : Number(size));
  }

  private async noReply(): Promise<AgentFailure> {
    await this.exited;
    if (this.timedOut) return this.timeoutFailure();
    if (this.target.op?.cancelled) return stopping(this.target.desktopId);
    // The cgroups could not be joined, or no guest init was found: the desktop stopped under us.
    if (this.stderr.startsWith(JOIN_FAILED) || this.stderr.startsWith('nsenter:') || this.stderr.startsWith(ENTER_FAILED)) {
      return new AgentFailure('not_running', `desktop ${this.target.desktopId} is not running`, false);
    }
    const detail = this.stderr.trim().split('\n')[0] ?? '';
    return new AgentFailure('runtime_error', `guest helper failed${detail ? `: ${detail}` : ''}`, true);
  }

  /** Why a body stopped short: the deadline, a stop of the desktop, or the file itself. */
  shortBody(): AgentFailure {
    if (this.timedOut) return this.timeoutFailure();
    if (this.target.op?.cancelled) return stopping(this.target.desktopId);
    return new AgentFailure('runtime_error', 'file ended early (changed while being read?)', true);
  }

  private timeoutFailure(): AgentFailure {
    return new AgentFailure('timeout', `guest operation did not finish within ${this.timeoutMs} ms`, true);
  }
}

/**
 * The cold chain: the shell joins the desktop's cgroups and execs nsenter, whose child (inside the
 * guest's pid namespace) runs the helper for this one operation.
 */
function spawnHelper(target: GuestTarget, op: HelperOp, args: readonly string[], guestCaps: boolean): Promise<SpawnedProcess> {
  const entry = { desktopId: target.desktopId, initPid: target.initPid, nsenterPath: target.nsenterPath, workdir: '/', guestCaps };
  const [file, argv] = enterArgv(entry, ['/usr/bin/perl', '-e', guestHelperProgram(op), '--', op, ...args]);
  return spawnProcess(
    file,
    argv,
    // A detached process inherits the guest environment; every other helper needs only PATH
    // (and skips loading locale files at startup).
    { env: op === 'spawn' ? { ...GUEST_ENV } : { PATH: GUEST_PATH }, stdio: ['pipe', 'pipe', 'pipe'] },
  );
}

function fail(code: AgentErrorCode, message: string): never {
  throw new AgentFailure(code, message, false);
}

function stopping(desktopId: string): AgentFailure {
  return new AgentFailure('not_running', `desktop ${desktopId} stopped during the operation`, false);
}
