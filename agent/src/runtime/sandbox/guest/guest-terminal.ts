/**
 * Terminals: a program on a pseudo-terminal inside a desktop, one per terminal client.
 *
 * node-pty makes the pty on the host and forks the chain that enters the guest the way exec does:
 * the desktop's cgroups first, then `nsenter` into the guest init's namespaces and root. The
 * chain's last host-side step is `setsid --ctty`, run by nsenter's child inside the guest's pid
 * namespace with nsenter's full capabilities: it starts a session inside the guest and takes the
 * pty as that session's controlling terminal, stealing it from node-pty's host-side session (which
 * needs CAP_SYS_ADMIN, so it runs before `setpriv`). The shell is then a session leader inside the
 * guest, job control and SIGWINCH work, and exit statuses travel back through nsenter to node-pty.
 * Only then does `setpriv` drop to the guest's capabilities, so the program has no more power than
 * any guest code and counts against the desktop's limits.
 *
 * The pty's master lives in the agent, outside the guest: CRIU cannot dump a process that holds
 * the slave. Closing a session therefore kills the chain, the guest session it leads (background
 * jobs included), and then any process of the desktop that still holds the pty (one that left the
 * session with `setsid` but kept its stdio); hibernate and destroy call `closeAll` under the
 * driver's fence, which refuses new terminals until the stop is over.
 *
 * Typed bytes reach the pty through a small writer process (agent/guest/terminal-writer.pl), never through
 * node-pty's own write, which blocks the event loop when the program stops reading.
 *
 * node-pty is a native module, loaded on the first terminal: an agent whose copy fails to load
 * still starts and answers `unsupported` for terminals.
 */
import { statSync } from 'node:fs';
import { readdir, readFile, stat } from 'node:fs/promises';
import { spawn, type ChildProcess } from 'node:child_process';
import { AgentFailure } from '../../../../../shared/src/protocol.js';
import type { TerminalSession, TerminalSpec } from '../../driver.js';
import { cgroupDirs, joinArgv } from '../host/cgroups.js';
import { guestFile, perlProgram } from './guest-programs.js';
import type { InitProcess } from '../host/cold-boot.js';
import { GUEST_CAPS_ONLY, GUEST_ENV, nsenterArgv } from './guest-init.js';
import { guestFilterArgv } from './guest-filter.js';
import { killTree, procStatSync, signal, waitFor } from '../host/host-procs.js';

type NodePty = typeof import('@lydell/node-pty');
type Pty = ReturnType<NodePty['spawn']>;

export interface TerminalSessionsOptions {
  readonly nsenterPath: string;
  /** The desktop's running guest init; rejects with `not_found` / `not_running`. */
  readonly init: (desktopId: string) => Promise<InitProcess>;
  /** True while the desktop is stopping (in-flight.ts): nothing new may enter it. */
  readonly fenced: (desktopId: string) => boolean;
  readonly log: (msg: string, fields?: object) => void;
}

/**
 * What is typed goes into the pty's master through this small process, which holds a copy of the
 * master's fd as its fd 3. libuv writes to a pty master in blocking mode (it cannot reopen a
 * master non-blocking), so a program that stops reading its input would, once the pty's buffer is
 * full, block the agent's whole event loop in node-pty's own write. Here only this process blocks,
 * and its stdin, a pipe, gives the relay ordinary backpressure.
 */
/** Typed bytes waiting for the writer above which the client is not read. */
const INPUT_HIGH_WATER = 256 * 1024;
/** How long a killed session gets to be reported gone. */
const KILLED_GONE_MS = 5_000;
export const TERMINAL_TYPE = 'xterm-256color';
/** How often a paused terminal looks whether its program has ended (node-pty drops the rest 200 ms after). */
const EXIT_WATCH_MS = 40;


let loading: Promise<NodePty | null> | null = null;

function loadPty(log: TerminalSessionsOptions['log']): Promise<NodePty | null> {
  loading ??= import('@lydell/node-pty').then(
    (mod: NodePty & { default?: NodePty }) => (typeof mod.spawn === 'function' ? mod : (mod.default ?? null)),
    (err: unknown) => {
      log('node-pty did not load: terminals are unavailable on this host', { error: String(err) });
      return null;
    },
  );
  return loading;
}

class GuestTerminal implements TerminalSession {
  readonly exited: Promise<number>;
  private killing: Promise<void> | null = null;
  private gone = false;
  private exitWatch: NodeJS.Timeout | null = null;
  /** The pty's device number, read while it surely exists. */
  private readonly rdev: number | null;

  /** Writes what is typed into the pty's master (agent/guest/terminal-writer.pl). */
  private readonly writer: ChildProcess;

  constructor(
    readonly desktopId: string,
    private readonly pty: Pty,
  ) {
    // The unix terminal names its slave device (`/dev/pts/N`) and its master's fd; the typings leave them out.
    const unix = pty as Pty & { readonly ptsName?: string; readonly fd?: number };
    this.rdev = ptyDevice(unix.ptsName);
    this.writer = spawn('perl', ['-e', terminalWriterProgram()], { stdio: ['pipe', 'ignore', 'ignore', unix.fd ?? 'ignore'] });
    this.writer.on('error', () => undefined);
    this.writer.stdin?.on('error', () => undefined);
    const status = new Promise<number>((resolve) => {
      pty.onExit(({ exitCode, signal: sig }) => {
        this.gone = true;
        resolve(sig !== undefined && sig > 0 ? 128 + sig : exitCode);
      });
    });
    // A job the program left running in the background still holds the terminal: it goes too.
    this.exited = status.then(async (code) => {
      // The writer's copy of the master keeps the pty's number from being reused meanwhile: no
      // later terminal can be taken for a holder of this one.
      if (this.rdev !== null) await killHolders(desktopId, this.rdev);
      this.writer.kill('SIGKILL');
      return code;
    });
  }

  onData(listener: (data: Buffer) => void): void {
    // Spawned with `encoding: null`: the chunks are Buffers, whatever the typings say.
    this.pty.onData((data) => listener(data as unknown as Buffer));
  }

  write(data: Buffer): boolean {
    const stdin = this.writer.stdin;
    if (this.gone || stdin === null || stdin.destroyed) return true;
    stdin.write(data);
    // More slack than the pipe's own mark, so a paste does not stop and start every 16 KiB;
    // 'drain' still comes once the buffer empties.
    return stdin.writableLength < INPUT_HIGH_WATER;
  }

  onDrain(listener: () => void): void {
    this.writer.stdin?.on('drain', listener);
  }

  resize(cols: number, rows: number): void {
    if (!this.gone) this.pty.resize(cols, rows);
  }

  /**
   * node-pty reads what a program wrote only while not paused, and destroys the pty 200 ms after
   * the program exits whatever is still unread: a terminal paused for a slow client when its
   * program ends would lose the end of the output. So a paused terminal watches for its program's
   * end and reads on then (what is left is bounded by the pty's buffer).
   */
  pause(): void {
    this.pty.pause();
    this.exitWatch ??= setInterval(() => {
      if (!this.gone && procStatSync(this.pty.pid) !== null) return;
      this.resume();
    }, EXIT_WATCH_MS);
    this.exitWatch.unref();
  }

  resume(): void {
    if (this.exitWatch !== null) clearInterval(this.exitWatch);
    this.exitWatch = null;
    this.pty.resume();
  }

  close(): void {
    void this.kill();
  }

  /** Kills the chain, its guest session and whatever else holds the pty; resolves once gone. */
  kill(): Promise<void> {
    // Once the program has exited, `exited` does the cleanup while the writer still pins the pty's
    // number. Killing again after that would kill by a pid and a pty number that a later terminal
    // may already have been given (it once SIGKILLed the next terminal's program).
    if (this.gone) return this.exited.then(() => undefined);
    this.killing ??= (async () => {
      await killTree(this.pty.pid);
      if (this.rdev !== null) await killHolders(this.desktopId, this.rdev);
      this.writer.kill('SIGKILL');
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([this.exited, new Promise<void>((resolve) => (timer = setTimeout(resolve, KILLED_GONE_MS)))]);
      clearTimeout(timer);
    })();
    return this.killing;
  }
}

function ptyDevice(path: string | undefined): number | null {
  if (path === undefined) return null;
  try {
    return statSync(path).rdev;
  } catch {
    return null;
  }
}

/**
 * SIGKILLs every process of the desktop holding a terminal of the host's devpts: the one numbered
 * `rdev`, or any (null). The guest's own ptys (its xterms) are on its own devpts instance, another
 * device, and are left alone. Returns how many were killed.
 */
async function killHolders(desktopId: string, rdev: number | null): Promise<number> {
  // One scan at a time on the host: the guest decides how many processes and descriptors there
  // are, and scans at once (terminals ending together) would fill the I/O pool every file
  // operation of every desktop waits on.
  const turn = holderScans.then(() => scanHolders(desktopId, rdev));
  holderScans = turn.then(() => undefined, () => undefined);
  return turn;
}

let holderScans: Promise<void> = Promise.resolve();
/**
 * Descriptors looked at per process. A job a terminal leaves behind holds it as 0, 1 or 2; one
 * that moved it past the usual soft limit (1024) on purpose could close it as well, so nothing
 * is lost by not looking further, and a guest holding millions costs the host nothing.
 */
const HOLDER_FDS_CHECKED = 1024;

async function scanHolders(desktopId: string, rdev: number | null): Promise<number> {
  const hostPts = await stat('/dev/pts').then((st) => st.dev, () => null);
  const procs = cgroupDirs(desktopId).find((dir) => dir.includes('/pids/'));
  if (hostPts === null || procs === undefined) return 0;
  const text = await readFile(`${procs}/cgroup.procs`, 'utf8').catch(() => '');
  const killed: number[] = [];
  for (const pid of text.split('\n').filter(Boolean).map(Number)) {
    const fds = (await readdir(`/proc/${pid}/fd`).catch(() => [] as string[])).filter((fd) => Number(fd) < HOLDER_FDS_CHECKED);
    for (const fd of fds) {
      const st = await stat(`/proc/${pid}/fd/${fd}`).catch(() => null);
      if (st !== null && st.isCharacterDevice() && st.dev === hostPts && (rdev === null || st.rdev === rdev)) {
        signal(pid, 'SIGKILL');
        killed.push(pid);
        break;
      }
    }
  }
  // Gone (or a zombie the guest init reaps) before a dump may start.
  await waitFor(() => killed.every((pid) => procStatSync(pid) === null), KILLED_GONE_MS);
  return killed.length;
}

export class TerminalSessions {
  private readonly sessions = new Map<string, Set<GuestTerminal>>();
  private closing = false;
  /**
   * Desktops this agent booted or restored and has opened no terminal in since: none of their
   * processes can hold a terminal of the host, so their hibernate skips the search for strays
   * (≈2 ms of each, measured; it stats every descriptor of every process). This agent's own
   * terminals leave none anyway (a session's holders are killed when it ends or is killed); the
   * search is for an earlier agent's, so a desktop adopted from one is searched.
   */
  private readonly clean = new Set<string>();

  constructor(private readonly options: TerminalSessionsOptions) {}

  /** This agent is booting or restoring the desktop: no process of it holds a terminal of the host. */
  booting(desktopId: string): void {
    this.clean.add(desktopId);
  }

  async open(desktopId: string, spec: TerminalSpec): Promise<TerminalSession> {
    // Before anything else: whatever this open gets to, a process may hold the terminal later.
    this.clean.delete(desktopId);
    if (this.closing) throw new AgentFailure('not_running', 'the driver is closing', false);
    const pty = await loadPty(this.options.log);
    if (pty === null) throw new AgentFailure('unsupported', 'terminals are unavailable on this host', false);
    const init = await this.options.init(desktopId);
    if (this.options.fenced(desktopId)) throw new AgentFailure('not_running', `desktop ${desktopId} is stopping`, false);
    if (this.closing) throw new AgentFailure('not_running', 'the driver is closing', false);
    // From the fence check to the registration nothing awaits: closeAll sees this session or
    // this call sees the fence.
    const argv = [
      ...joinArgv(desktopId, 3),
      ...nsenterArgv(this.options.nsenterPath, init.pid, '/root'),
      ...guestFilterArgv(),
      '/usr/bin/setsid', '--ctty', ...GUEST_CAPS_ONLY,
      '/bin/sh', '-c', guestFile('terminal.sh'), 'canto-terminal', ...(spec.command === null ? [] : [spec.command]),
    ];
    const terminal = new GuestTerminal(
      desktopId,
      pty.spawn('/bin/sh', argv, {
        name: TERMINAL_TYPE,
        cols: spec.cols,
        rows: spec.rows,
        cwd: '/',
        env: { ...GUEST_ENV, TERM: TERMINAL_TYPE, COLORTERM: 'truecolor' },
        encoding: null,
      }),
    );
    this.register(terminal);
    this.options.log('terminal started', { desktopId, cols: spec.cols, rows: spec.rows, command: spec.command !== null });
    void terminal.exited.then((code) => this.options.log('terminal ended', { desktopId, exitCode: code }));
    return terminal;
  }

  /**
   * Ends every terminal of the desktop and waits until they are gone (hibernate, destroy). Then
   * whatever else in the desktop still holds a host pty goes too: terminals of an agent that was
   * restarted since, which this one does not know, would break the memory snapshot.
   */
  async closeAll(desktopId: string): Promise<void> {
    await Promise.all([...(this.sessions.get(desktopId) ?? [])].map((t) => t.kill()));
    // The desktop stops now: its next start by this agent marks it clean again.
    if (this.clean.delete(desktopId)) return;
    const strays = await killHolders(desktopId, null);
    if (strays > 0) this.options.log('processes holding a terminal of an earlier agent were killed', { desktopId, count: strays });
  }

  /** Ends every terminal (the driver is closing). */
  async close(): Promise<void> {
    this.closing = true;
    await Promise.all([...this.sessions.values()].flatMap((set) => [...set]).map((t) => t.kill()));
  }

  private register(terminal: GuestTerminal): void {
    let set = this.sessions.get(terminal.desktopId);
    if (set === undefined) this.sessions.set(terminal.desktopId, (set = new Set()));
    set.add(terminal);
    void terminal.exited.then(() => {
      set.delete(terminal);
      if (set.size === 0 && this.sessions.get(terminal.desktopId) === set) this.sessions.delete(terminal.desktopId);
    });
  }
}

/** The input writer's program: agent/guest/terminal-writer.pl with the errno values it names. */
export function terminalWriterProgram(): string {
  return perlProgram([guestFile('terminal-writer.pl')]);
}
