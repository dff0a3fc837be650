/**
 * Running a command inside a desktop. The command enters the guest init's namespaces and root with
 * nsenter (the kernel's view of the guest root, never a host-side path walk), inside the desktop's
 * cgroups, and starts with `setsid` so it and anything it leaves running belong to a session inside
 * the guest's pid namespace — CRIU refuses to dump a process whose session leader is outside.
 *
 * stdio are pipes, never host files: a background job that inherits them stays dumpable. Because a
 * background job may hold the pipes open forever, the result is taken when the shell exits, after
 * a short grace for the pipes to drain. On timeout the whole session is killed.
 *
 * A user command goes to the desktop's warm exec server when one is ready (warm-pool.ts): a child
 * of it, already inside the guest with the guest's capabilities and cgroups, does what the cold
 * chain's end does (setsid, env file, real pipes, the 20 ms grace rounds) and relays the output in
 * frames (warm-perl.ts). A child that is gone before it said "started" (which it says before it
 * forks the shell) makes the command run cold instead: it never ran, so it runs exactly once. One
 * gone after that fails the exec as retryable: the command may have run.
 */
import type { Socket } from 'node:net';
import { constants } from 'node:os';
import type { Readable, Writable } from 'node:stream';
import { AgentFailure } from '../../../../../shared/src/protocol.js';
import type { ExecOutcome } from '../../driver.js';
import { RELAY_JOIN_FAILED } from './exec-relay.js';
import { ENTER_FAILED, execArgv, warmServerArgv } from './guest-entry.js';
import { GUEST_ENV } from './guest-init.js';
import { lengthFramed, WARM_IDLE } from './guest-helper.js';
import { killTree } from '../host/host-procs.js';
import { spawnProcess, type SpawnedProcess } from '../host/spawner.js';
import { execServerProgram } from './warm-perl.js';

/** Output kept by the driver's own commands (first boot, probes). */
export const MAX_OUTPUT_BYTES = 8 * 1024 * 1024;
/** How long to keep reading the pipes after the shell exits (background jobs may hold them). */
const DRAIN_GRACE_MS = 100;
/** How long a warm child gets to kill the command's session when asked to. */
const WARM_KILL_MS = 2_000;

export interface GuestExecOptions {
  readonly desktopId: string;
  readonly initPid: number;
  readonly nsenterPath: string;
  readonly command: string;
  readonly timeoutMs: number;
  readonly stdin?: string;
  /** Bytes kept of each of stdout and stderr; the rest is read and dropped. */
  readonly maxOutputBytes: number;
  /** Apply the guest's env file (`/root/.canto/env`) first: user commands, not the driver's own. */
  readonly sourceEnv?: boolean;
  /** Keep every capability: only for the driver's own setup commands, never for user commands. */
  readonly privileged?: boolean;
  /** A connection to the desktop's warm exec server, if one is ready; for user commands only. */
  readonly warm?: () => Promise<Socket | null>;
  /** Called with a function that kills the command; the driver uses it before hibernating. */
  readonly register?: (kill: () => Promise<void>) => () => void;
  /** Checked when the command ends: true when the driver killed it because the desktop stopped. */
  readonly stopped?: () => boolean;
}

/**
 * Sources the env file, then runs the command (passed as `$0`) in a fresh shell, so the command
 * sees `sh -c` semantics of its own and a broken env file cannot change how it is parsed.
 */
const WITH_ENV = '[ -f /root/.canto/env ] && . /root/.canto/env; exec /bin/sh -c "$0"';

/** The warm exec server: its socket, the way into the guest (guest-entry.ts) with the guest's capabilities, then the server. */
export function startWarmExecServer(desktopId: string, initPid: number, nsenterPath: string, socketDir: string, socketName: string): Promise<SpawnedProcess> {
  const entry = { desktopId, initPid, nsenterPath, workdir: '/root', guestCaps: true };
  const program = ['/usr/bin/perl', '-e', execServerProgram(WITH_ENV, constants.errno.EINTR, WARM_IDLE), '--'];
  const [file, args] = warmServerArgv(entry, socketDir, socketName, program);
  // A group of its own (detached), so retiring it kills everything it forked.
  return spawnProcess(file, args, { env: { ...GUEST_ENV }, stdio: ['pipe', 'pipe', 'pipe'], detached: true });
}

/** Keeps the first `limit` bytes of a stream and keeps reading (and dropping) the rest. */
class Capture {
  private readonly chunks: Buffer[] = [];
  private size = 0;
  truncated = false;

  constructor(private readonly limit: number) {}

  static of(stream: Readable, limit: number): Capture {
    const capture = new Capture(limit);
    stream.on('data', (chunk: Buffer) => capture.push(chunk));
    stream.on('error', () => undefined);
    return capture;
  }

  push(chunk: Buffer): void {
    if (this.size + chunk.length > this.limit) this.truncated = true;
    if (this.size >= this.limit) return;
    const part = chunk.subarray(0, this.limit - this.size);
    this.chunks.push(part);
    this.size += part.length;
  }

  text(): string {
    return Buffer.concat(this.chunks).toString('utf8');
  }
}

interface Outcome {
  /** The exit code; null when a warm child ended without reporting one. */
  readonly code: number | null;
  /** False only for a warm child that ended before starting the command. */
  readonly started: boolean;
  readonly stdout: Capture;
  readonly stderr: Capture;
}

interface Run {
  readonly done: Promise<Outcome>;
  kill(): Promise<void>;
}

const IDLE_RUN: Run = { done: new Promise<Outcome>(() => undefined), kill: async () => undefined };

/**
 * The cold way in (guest-entry.ts: the relay's pipes, the namespaces, the bounding set, a session
 * of its own), then the shell. The run
 * is there (and can be killed) at once; a kill before the process has started kills it as soon
 * as it has.
 */
function coldRun(opts: GuestExecOptions, limit: number): Run {
  let killed = false;
  let root: number | undefined;
  const done = startCold(opts, limit).then(({ child, outcome }) => {
    root = child.pid;
    if (killed && root !== undefined) void killTree(root);
    return outcome;
  });
  return {
    done,
    kill: async () => {
      killed = true;
      if (root !== undefined) await killTree(root);
    },
  };
}

async function startCold(opts: GuestExecOptions, limit: number): Promise<{ child: SpawnedProcess; outcome: Promise<Outcome> }> {
  const entry = { desktopId: opts.desktopId, initPid: opts.initPid, nsenterPath: opts.nsenterPath, workdir: '/root', guestCaps: opts.privileged !== true };
  const [file, args] = execArgv(entry, ['/bin/sh', '-c', ...(opts.sourceEnv ? [WITH_ENV, opts.command] : [opts.command])]);
  const child = await spawnProcess(file, args, { env: { ...GUEST_ENV }, stdio: ['pipe', 'pipe', 'pipe'] });
  const stdout = Capture.of(child.stdout as Readable, limit);
  const stderr = Capture.of(child.stderr as Readable, limit);
  const stdin = child.stdin as Writable;
  stdin.on('error', () => undefined);
  stdin.end(opts.stdin ?? '');
  const outcome = new Promise<Outcome>((resolve, reject) => {
    child.on('error', reject);
    child.on('exit', (exitCode: number | null, sig: NodeJS.Signals | null) => {
      // Destroyed in the check phase after the timer, not in the timer itself: on a loop that was
      // busy for longer than the grace, the timer runs before the poll phase, and output already
      // in the pipes (the `echo` a command ended with) would be dropped unread.
      const drain = setTimeout(() => {
        setImmediate(() => {
          child.stdout?.destroy();
          child.stderr?.destroy();
        });
      }, DRAIN_GRACE_MS);
      child.on('close', () => {
        clearTimeout(drain);
        resolve({ code: exitCode ?? 128 + (sig ? constants.signals[sig] : 0), started: true, stdout, stderr });
      });
    });
  });
  return { child, outcome };
}

const FRAME_HEAD = 9;
/**
 * The most a frame of the exec server carries (exec-server.pl reads 64 KiB at a time). Its
 * socket is the guest's to reach (the server runs with the guest's privileges): a frame that
 * claims more is not the server's, and buffering it would let a guest grow the agent's memory and
 * hold its event loop, every desktop's.
 */
export const MAX_FRAME_BYTES = 65536;

/**
 * The exec server's frames (a tag byte, 8 hex digits of length, the bytes) from the socket's
 * chunks: `frame` for each whole one, `bad` once for one that is malformed or too large.
 */
export function frameReader(frame: (tag: string, data: Buffer) => void, bad: () => void): (chunk: Buffer) => void {
  let pending: Buffer = Buffer.alloc(0);
  let failed = false;
  return (chunk) => {
    if (failed) return;
    pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk]);
    while (pending.length >= FRAME_HEAD) {
      const head = pending.toString('latin1', 1, FRAME_HEAD);
      const length = /^[0-9a-f]{8}$/.test(head) ? parseInt(head, 16) : -1;
      if (length < 0 || length > MAX_FRAME_BYTES) {
        failed = true;
        pending = Buffer.alloc(0);
        return bad();
      }
      const end = FRAME_HEAD + length;
      if (pending.length < end) break;
      const data = pending.subarray(FRAME_HEAD, end);
      const tag = String.fromCharCode(pending[0] as number);
      pending = pending.subarray(end);
      frame(tag, data);
    }
  };
}

/** A command on a warm child: the request goes out, frames come back (see warm-perl.ts). */
function warmRun(socket: Socket, command: string, limit: number): Run {
  const stdout = new Capture(limit);
  const stderr = new Capture(limit);
  let started = false;
  let code: number | null = null;
  socket.on('data', frameReader((tag, data) => {
    if (tag === 's') started = true;
    else if (tag === 'o') stdout.push(data);
    else if (tag === 'e') stderr.push(data);
    else if (tag === 'x' && /^[0-9]{1,3}$/.test(data.toString('latin1'))) code = Number(data.toString('latin1'));
  }, () => socket.destroy()));
  socket.on('error', () => undefined);
  socket.resume();
  const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
  socket.write(lengthFramed(Buffer.from(command, 'utf8')));
  return {
    done: closed.then(() => ({ code, started, stdout, stderr })),
    kill: async () => {
      // The child kills the session from inside the guest and then hangs up.
      if (!socket.destroyed) {
        socket.write('k');
        let timer: NodeJS.Timeout | undefined;
        await Promise.race([closed, new Promise<void>((resolve) => (timer = setTimeout(resolve, WARM_KILL_MS)))]);
        clearTimeout(timer);
      }
      socket.destroy();
    },
  };
}

export async function guestExec(opts: GuestExecOptions): Promise<ExecOutcome> {
  const limit = Number.isSafeInteger(opts.maxOutputBytes) ? Math.max(0, opts.maxOutputBytes) : MAX_OUTPUT_BYTES;
  // A warm child applies the env file with the guest's capabilities, takes no input, and would
  // pass on a NUL that a cold spawn refuses.
  const warmable =
    opts.sourceEnv === true && opts.privileged !== true && opts.stdin === undefined && !opts.command.includes('\0');
  const socket = warmable && opts.warm !== undefined ? await opts.warm() : null;

  let current = IDLE_RUN;
  const unregister = opts.register?.(() => current.kill()) ?? (() => undefined);
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    void current.kill();
  }, opts.timeoutMs);

  try {
    let outcome: Outcome | null = null;
    if (socket !== null) {
      if (opts.stopped?.()) socket.destroy();
      else {
        current = warmRun(socket, opts.command, limit);
        outcome = await current.done;
      }
    }
    if (outcome === null || (!outcome.started && !timedOut && !opts.stopped?.())) {
      // Checked and spawned in one synchronous step: a stop's kill reaches either nothing yet
      // (and the check sees it) or this run.
      if (!opts.stopped?.()) {
        current = coldRun(opts, limit);
        outcome = await current.done;
      }
    }
    if (timedOut) {
      throw new AgentFailure('timeout', `command did not finish within ${opts.timeoutMs} ms`, true);
    }
    if (opts.stopped?.() || outcome === null) {
      throw new AgentFailure('not_running', `desktop ${opts.desktopId} stopped while the command ran`, false);
    }
    const said = outcome.stderr.text();
    if ((outcome.code === 97 && said.startsWith(RELAY_JOIN_FAILED)) || (outcome.code === 1 && said.startsWith(ENTER_FAILED))) {
      // The cgroups could not be joined, or the guest could not be entered: the desktop stopped under us.
      throw new AgentFailure('not_running', 'desktop is not running', false);
    }
    if (outcome.code === null) {
      throw new AgentFailure('runtime_error', 'the command\u2019s relay in the guest ended without an exit code', true);
    }
    return {
      exitCode: outcome.code,
      stdout: outcome.stdout.text(),
      stderr: outcome.stderr.text(),
      stdoutTruncated: outcome.stdout.truncated,
      stderrTruncated: outcome.stderr.truncated,
    };
  } finally {
    clearTimeout(timer);
    unregister();
  }
}
