/**
 * Cold boot: start bubblewrap detached (its own session, no pipe the agent must keep open beyond
 * the handshake) so the desktop survives the agent. The handshake has two parts: bwrap's info fd
 * reports the guest init's host pid, and the init script writes `ready` on fd 4 once Xvfb answers
 * and the screen has its default size. Both are pipes the agent drops right after reading.
 *
 * A first boot also hands the init the desktop's env file on fd 5, which it writes into the guest
 * before starting Xvfb (first-boot.ts): the content never touches a host path, and the first
 * boot needs no exec of its own.
 *
 * bwrap reads the guest's seccomp filter from fd 6 (guest-filter.ts) and, with the namespaces and
 * mounts made, waits on fd 7 before the guest's first instruction: the agent seals the host-wide
 * parts of its /proc meanwhile (proc-seal.ts), then writes `go`.
 */
import { spawn } from 'node:child_process';
import { closeSync, openSync } from 'node:fs';
import { join } from 'node:path';
import type { Readable, Writable } from 'node:stream';
import { AgentFailure } from '../../../../../shared/src/protocol.js';
import { joinArgv } from './cgroups.js';
import { bwrapArgs, GUEST_BLOCK_FD, GUEST_ENV } from '../guest/guest-init.js';
import { GUEST_FILTER, GUEST_FILTER_FD } from '../guest/guest-filter.js';
import { sealProcSys, untilBlockedOn } from './proc-seal.js';
import { isSameProcessSync, procStat, signal } from './host-procs.js';
import { readJson, readJsonSync, type DesktopPaths } from './layout.js';

export interface InitProcess {
  readonly pid: number;
  readonly startTime: string;
}

const BOOT_TIMEOUT_MS = 15_000;

/** Reads a stream until it ends or `done(text)` says enough; resolves with what was read. */
function readUntil(stream: Readable, done: (text: string) => boolean): Promise<string> {
  return new Promise((resolve) => {
    let text = '';
    const finish = () => {
      stream.removeAllListeners('data');
      stream.destroy();
      resolve(text);
    };
    stream.on('data', (chunk: Buffer) => {
      text += chunk.toString('utf8');
      if (done(text)) finish();
    });
    stream.on('end', finish);
    stream.on('error', finish);
  });
}

export async function coldBoot(
  paths: DesktopPaths,
  desktopId: string,
  tools: { readonly bwrap: string; readonly nsenter: string },
  envFile: string | null = null,
): Promise<InitProcess> {
  const log = openSync(join(paths.run, 'boot.log'), 'a');
  let child;
  try {
    child = spawn('/bin/sh', [...joinArgv(desktopId, GUEST_BLOCK_FD + 1), tools.bwrap, ...bwrapArgs(paths, desktopId, envFile !== null)], {
      detached: true,
      env: { ...GUEST_ENV },
      stdio: ['ignore', log, log, 'pipe', 'pipe', envFile === null ? 'ignore' : 'pipe', 'pipe', 'pipe'],
    });
  } finally {
    closeSync(log);
  }
  child.unref();
  if (envFile !== null) {
    // An init that fails before reading it closes the pipe: its boot fails below, not the write.
    const env = child.stdio.at(5) as Writable;
    env.on('error', () => {});
    env.end(envFile);
  }
  // bwrap reads the filter whole before it starts the guest; one that cannot is a failed boot.
  const filter = child.stdio.at(GUEST_FILTER_FD) as Writable;
  filter.on('error', () => {});
  filter.end(GUEST_FILTER);
  const info = child.stdio[3] as Readable;
  const ready = child.stdio[4] as Readable;
  // bwrap waits on this before the guest's first instruction, until /proc is sealed. bwrap goes
  // on when it closes unwritten (this process gone, say): the init then finds /proc writable and
  // stops (agent/guest/init.sh), and a failure here kills the guest before it closes.
  const block = child.stdio.at(GUEST_BLOCK_FD) as Writable;
  block.on('error', () => {});
  let pid = Number.NaN;
  const timer = setTimeout(() => {
    if (Number.isInteger(pid)) signal(pid, 'SIGKILL');
    info.destroy();
    ready.destroy();
  }, BOOT_TIMEOUT_MS);
  try {
    const readyText = readUntil(ready, (t) => t.includes('\n'));
    pid = Number(/"child-pid":\s*(\d+)/.exec(await readUntil(info, (t) => /"child-pid":\s*\d+[\s\S]*}/.test(t)))?.[1] ?? Number.NaN);
    if (Number.isInteger(pid)) {
      await untilBlockedOn(pid, GUEST_BLOCK_FD, desktopId, join(paths.run, 'boot.log'));
      await sealProcSys(pid, tools.nsenter, desktopId);
      block.end('go');
    }
    if (!Number.isInteger(pid) || (await readyText).trim() !== 'ready') {
      if (Number.isInteger(pid)) signal(pid, 'SIGKILL');
      throw new AgentFailure(
        'runtime_error',
        `desktop ${desktopId} failed to boot (${(await readyText).trim() || 'no ready signal'}); see ${paths.run}/boot.log and disk/var/log/canto/init.log`,
        true,
      );
    }
    const st = await procStat(pid);
    if (st === null) throw new AgentFailure('runtime_error', `desktop ${desktopId} init exited during boot`, true);
    return { pid, startTime: st.startTime };
  } catch (err) {
    // A guest whose /proc could not be sealed never runs: bwrap still waits on the block fd.
    if (Number.isInteger(pid)) signal(pid, 'SIGKILL');
    if (child.pid !== undefined) signalGroup(child.pid);
    block.destroy();
    throw err;
  } finally {
    clearTimeout(timer);
  }
}

/** SIGKILL to the process group of the boot's shell and bwrap (spawned detached, so it leads one). */
function signalGroup(leader: number): void {
  try {
    process.kill(-leader, 'SIGKILL');
  } catch {
    // Gone already.
  }
}

/** The guest init recorded for the desktop, if that process is still alive. */
export async function runningInit(paths: DesktopPaths): Promise<InitProcess | null> {
  return aliveInit(await readJson<InitProcess>(paths.initFile));
}

/**
 * runningInit, synchronously, for a walk over every desktop of the host (the driver's `list`):
 * a small local file and a /proc read each, cheaper done at once than as two thread-pool round
 * trips.
 */
export function runningInitSync(paths: DesktopPaths): InitProcess | null {
  return aliveInit(readJsonSync<InitProcess>(paths.initFile));
}

function aliveInit(init: InitProcess | null): InitProcess | null {
  if (init === null || !Number.isInteger(init.pid)) return null;
  return isSameProcessSync(init.pid, init.startTime) ? init : null;
}
