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
 * A call is registered with the desktop's in-flight set (in-flight.ts) so that hibernate and
 * destroy can wait for it or kill it; a call killed that way fails with `not_running`.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import type { Readable, Writable } from 'node:stream';
import { AgentFailure, type AgentErrorCode } from '../../../../shared/src/protocol.js';
import { JOIN_FAILED, joinArgv } from './cgroups.js';
import { guestHelperProgram, type HelperOp } from './guest-helper.js';
import { GUEST_CAPS, GUEST_ENV, GUEST_PATH } from './guest-init.js';
import { killTree } from './host-procs.js';
import type { GuestOp } from './in-flight.js';

export interface GuestTarget {
  readonly desktopId: string;
  readonly initPid: number;
  readonly nsenterPath: string;
  /** The in-flight registration; null for the driver's own calls under the lifecycle mutex. */
  readonly op: GuestOp | null;
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

export class GuestCall {
  readonly stdin: Writable;
  private readonly child: ChildProcess;
  private readonly it: AsyncIterator<Buffer>;
  private pending: Buffer = Buffer.alloc(0);
  private stderr = '';
  private timer: NodeJS.Timeout | undefined;
  private timedOut = false;
  private timeoutMs = 0;
  private readonly exited: Promise<number | null>;

  private constructor(
    private readonly target: GuestTarget,
    op: HelperOp,
    args: readonly string[],
    opts: CallOptions,
  ) {
    if (target.op?.cancelled) throw stopping(target.desktopId);
    const caps = opts.guestCaps ? ['/usr/bin/setpriv', `--bounding-set=-all,${GUEST_CAPS.map((c) => `+${c}`).join(',')}`] : [];
    this.child = spawn(
      '/bin/sh',
      [
        ...joinArgv(target.desktopId),
        target.nsenterPath, '-t', String(target.initPid), '-m', '-u', '-i', '-n', '-p', '-r', '--wdns=/',
        ...caps, '/usr/bin/perl', '-e', guestHelperProgram(op), '--', op, ...args,
      ],
      // A detached process inherits the guest environment; every other helper needs only PATH
      // (and skips loading locale files at startup).
      { env: op === 'spawn' ? { ...GUEST_ENV } : { PATH: GUEST_PATH }, stdio: ['pipe', 'pipe', 'pipe'] },
    );
    this.stdin = this.child.stdin as Writable;
    this.stdin.on('error', () => undefined);
    const stdout = this.child.stdout as Readable;
    this.it = stdout[Symbol.asyncIterator]();
    (this.child.stderr as Readable).on('data', (chunk: Buffer) => {
      if (this.stderr.length < STDERR_KEEP) this.stderr += chunk.toString('utf8').slice(0, STDERR_KEEP);
    });
    this.exited = new Promise((resolve) => {
      this.child.on('error', () => resolve(null));
      this.child.on('close', (code) => resolve(code));
    });
    void this.exited.then(() => {
      clearTimeout(this.timer);
      target.op?.end();
    });
    target.op?.attach(() => this.kill());
    if (opts.timeoutMs !== null) this.arm(opts.timeoutMs);
  }

  static start(target: GuestTarget, op: HelperOp, args: readonly string[], opts: CallOptions): GuestCall {
    return new GuestCall(target, op, args, opts);
  }

  /** (Re)starts the deadline: when it passes, the helper is killed and the call fails with `timeout`. */
  arm(ms: number): void {
    clearTimeout(this.timer);
    this.timeoutMs = ms;
    this.timer = setTimeout(() => {
      this.timedOut = true;
      void this.kill();
    }, ms);
  }

  /**
   * Kills the helper and drops what it sent and nobody read: the call counts as finished (and
   * leaves the in-flight set) only once its stdout is closed, which unread data would prevent.
   */
  async kill(): Promise<void> {
    if (this.child.pid !== undefined && this.child.exitCode === null && this.child.signalCode === null) {
      await killTree(this.child.pid);
    }
    this.child.stdout?.destroy();
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
    // The cgroup prologue failed, or nsenter found no guest init: the desktop stopped under us.
    if (this.stderr.startsWith(JOIN_FAILED) || this.stderr.startsWith('nsenter:')) {
      return new AgentFailure('not_running', `desktop ${this.target.desktopId} is not running`, false);
    }
    const detail = this.stderr.trim().split('\n')[0] ?? '';
    return new AgentFailure('runtime_error', `guest helper failed${detail ? `: ${detail}` : ''}`, true);
  }

  private shortBody(): AgentFailure {
    if (this.timedOut) return this.timeoutFailure();
    if (this.target.op?.cancelled) return stopping(this.target.desktopId);
    return new AgentFailure('runtime_error', 'file ended early (changed while being read?)', true);
  }

  private timeoutFailure(): AgentFailure {
    return new AgentFailure('timeout', `guest operation did not finish within ${this.timeoutMs} ms`, true);
  }
}

function fail(code: AgentErrorCode, message: string): never {
  throw new AgentFailure(code, message, false);
}

function stopping(desktopId: string): AgentFailure {
  return new AgentFailure('not_running', `desktop ${desktopId} stopped during the operation`, false);
}
