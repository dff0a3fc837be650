/**
 * Running a command inside a desktop. The command enters the guest init's namespaces and root with
 * nsenter (the kernel's view of the guest root, never a host-side path walk), inside the desktop's
 * cgroups, and starts with `setsid` so it and anything it leaves running belong to a session inside
 * the guest's pid namespace — CRIU refuses to dump a process whose session leader is outside.
 *
 * stdio are pipes, never host files: a background job that inherits them stays dumpable. Because a
 * background job may hold the pipes open forever, the result is taken when the shell exits, after
 * a short grace for the pipes to drain. On timeout the whole session is killed.
 */
import { spawn } from 'node:child_process';
import { constants } from 'node:os';
import type { Readable, Writable } from 'node:stream';
import { AgentFailure } from '../../../../shared/src/protocol.js';
import type { ExecOutcome } from '../driver.js';
import { cgroupDirs } from './cgroups.js';
import { EXEC_RELAY, RELAY_JOIN_FAILED } from './exec-relay.js';
import { GUEST_CAPS, GUEST_ENV } from './guest-init.js';
import { killTree } from './host-procs.js';

/** Output kept by the driver's own commands (first boot, probes). */
export const MAX_OUTPUT_BYTES = 8 * 1024 * 1024;
/** How long to keep reading the pipes after the shell exits (background jobs may hold them). */
const DRAIN_GRACE_MS = 100;

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

/** Keeps the first `limit` bytes of a stream and keeps reading (and dropping) the rest. */
class Capture {
  private readonly chunks: Buffer[] = [];
  private size = 0;
  truncated = false;

  constructor(stream: Readable, limit: number) {
    stream.on('data', (chunk: Buffer) => {
      if (this.size + chunk.length > limit) this.truncated = true;
      if (this.size >= limit) return;
      const part = chunk.subarray(0, limit - this.size);
      this.chunks.push(part);
      this.size += part.length;
    });
    stream.on('error', () => undefined);
  }

  text(): string {
    return Buffer.concat(this.chunks).toString('utf8');
  }
}

export async function guestExec(opts: GuestExecOptions): Promise<ExecOutcome> {
  const groups = cgroupDirs(opts.desktopId);
  const argv = [
    '-e', EXEC_RELAY, '--', String(groups.length), ...groups,
    opts.nsenterPath, '-t', String(opts.initPid),
    '-m', '-u', '-i', '-n', '-p', '-r', '--wdns=/root',
    ...(opts.privileged ? [] : ['/usr/bin/setpriv', `--bounding-set=-all,${GUEST_CAPS.map((c) => `+${c}`).join(',')}`]),
    '/usr/bin/setsid', '/bin/sh', '-c',
    ...(opts.sourceEnv ? [WITH_ENV, opts.command] : [opts.command]),
  ];
  const child = spawn('perl', argv, { env: { ...GUEST_ENV }, stdio: ['pipe', 'pipe', 'pipe'] });
  const limit = Number.isSafeInteger(opts.maxOutputBytes) ? Math.max(0, opts.maxOutputBytes) : MAX_OUTPUT_BYTES;
  const stdout = new Capture(child.stdout as Readable, limit);
  const stderr = new Capture(child.stderr as Readable, limit);
  const stdin = child.stdin as Writable;
  stdin.on('error', () => undefined);
  stdin.end(opts.stdin ?? '');

  const kill = async () => {
    if (child.pid !== undefined) await killTree(child.pid);
  };
  const unregister = opts.register?.(kill) ?? (() => undefined);

  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    void kill();
  }, opts.timeoutMs);

  try {
    const code = await new Promise<number>((resolve, reject) => {
      child.on('error', reject);
      child.on('exit', (exitCode, sig) => {
        const drain = setTimeout(() => {
          child.stdout?.destroy();
          child.stderr?.destroy();
        }, DRAIN_GRACE_MS);
        child.on('close', () => {
          clearTimeout(drain);
          resolve(exitCode ?? 128 + (sig ? constants.signals[sig] : 0));
        });
      });
    });
    if (timedOut) {
      throw new AgentFailure('timeout', `command did not finish within ${opts.timeoutMs} ms`, true);
    }
    if (opts.stopped?.()) {
      throw new AgentFailure('not_running', `desktop ${opts.desktopId} stopped while the command ran`, false);
    }
    if (code === 97 && stderr.text().startsWith(RELAY_JOIN_FAILED)) {
      // The cgroup prologue failed: the desktop stopped under us.
      throw new AgentFailure('not_running', 'desktop is not running', false);
    }
    return {
      exitCode: code,
      stdout: stdout.text(),
      stderr: stderr.text(),
      stdoutTruncated: stdout.truncated,
      stderrTruncated: stderr.truncated,
    };
  } finally {
    clearTimeout(timer);
    unregister();
  }
}
