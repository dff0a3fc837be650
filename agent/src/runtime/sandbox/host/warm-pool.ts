/**
 * Warm servers: per running desktop, one process for file operations and one for exec that have
 * already entered the guest and hand each operation to a child forked there (warm-perl.ts).
 *
 * Most of a cold guest operation's time goes into getting there: a fork of the agent, a shell that
 * joins the desktop's cgroups, nsenter, and Perl compiling its program; and since every operation
 * pays it, a run of operations on a small host is bound by that work, not by waiting. A warm
 * server pays it once. An operation connects to the server's socket and talks to one of its
 * waiting children exactly as it would to a cold helper or relay; that child serves it and exits,
 * and the server forks the next one inside the guest. An operation that finds no server runs
 * cold, and starts the server for the next one; one that finds a server still starting waits for
 * it briefly (`STARTING_WAIT_MS`) before it runs cold. A desktop about to be used (the first start
 * of one moved here) gets its servers at once (`prewarm`): a moved desktop's first calls are
 * part of what its user sees of the move.
 *
 * A server belongs to one guest init (pid and start time): asked for another init, the pool drops
 * it, since it sits in namespaces that no longer exist. It leads its own process group, and every
 * process it forks stays in that group, so killing the group reaches all of them at once, even one
 * forked an instant before. Nothing is started while the desktop is fenced, and `retire` (which
 * hibernate and destroy call before the dump or the kill) returns once every server of the
 * desktop has exited: a foreign process in the guest's pid namespace would break a CRIU dump. A
 * server that dies (the guest may kill it) is replaced only when the next operation asks, so a
 * guest cannot make the agent spawn in a loop; one left unused for long is retired. One that stops
 * answering is replaced, and retired once its children have finished what they already serve.
 */
import type { ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { closeSync, openSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { connect, type Socket } from 'node:net';
import { join } from 'node:path';
import type { InitProcess } from './cold-boot.js';
import { processTree, procStat, signal, waitFor } from './host-procs.js';
import { TOKEN_HEX } from '../guest/warm-perl.js';

export type WarmKind = 'file' | 'exec';

/** A connection to a warm child, and the host pid of the server process group it came from. */
export interface WarmConnection {
  readonly socket: Socket;
  /** The host pid that leads the server's group: the child descends from it. */
  readonly serverPid: number;
}

export interface WarmPoolOptions {
  /**
   * Starts a server of `kind` for the guest of `init`, in a process group of its own, listening on
   * a socket named `socketName` in `socketDir`.
   */
  readonly start: (kind: WarmKind, desktopId: string, init: InitProcess, socketDir: string, socketName: string) => ChildProcess;
  /** The directory for the desktop's sockets: one only the driver (root) can reach. */
  readonly socketDir: (desktopId: string) => string;
  /** True while the desktop is stopping: nothing new may enter it. */
  readonly fenced: (desktopId: string) => boolean;
  readonly log?: (msg: string, fields?: object) => void;
}

/** An unused server is retired after this long. */
const IDLE_MS = 10 * 60_000;
/** A server not ready after this long is stuck (it compiles and forks in milliseconds). */
const READY_MS = 10_000;
/**
 * How long an operation waits for a server that is starting before it runs cold. A server comes
 * up in about the time a cold helper takes (both fork the agent and enter the guest), so waiting
 * for one already on its way is never slower by much, and spares a second start.
 */
const STARTING_WAIT_MS = 150;
/** A server not ready this long after its spawn is not waited for (it may be stuck: `READY_MS`). */
const STARTING_FRESH_MS = 1_000;
/** After a server failed to come up, operations on the desktop run cold this long before another try. */
const RETRY_MS = 5_000;
/**
 * How long a connection may wait for a child to take it. Children are forked as they are taken,
 * so only a server that cannot serve (stopped, wedged) takes this long.
 */
const ACK_MS = 5_000;
/** Bound on waiting for a killed server to be reaped; a SIGKILLed group ends at once. */
const EXIT_WAIT_MS = 5_000;
const STDERR_LOG_BYTES = 1024;
/** Log lines per server for what it writes to stderr. */
const STDERR_LOG_LINES = 20;

/**
 * Where a server listens. `dirFd` is an open descriptor of the directory: connecting through
 * `/proc/self/fd/<dirFd>/<name>` keeps the address within sun_path however deep the directory is.
 */
interface ServerSocket {
  readonly dir: string;
  readonly name: string;
  readonly dirFd: number;
}

function sockets(child: ChildProcess): Socket[] {
  return [child.stdin, child.stdout, child.stderr].filter((s) => s !== null) as Socket[];
}

class WarmServer {
  private readyFlag = false;
  /** Settles true once the server says `ready`, false if it exits first. */
  readonly ready: Promise<boolean>;
  /** When it was spawned (`performance.now()`). */
  readonly startedAt = performance.now();
  private settleReady!: (ready: boolean) => void;
  private readyTimer: NodeJS.Timeout | undefined;
  private exitedFlag = false;
  private idleTimer: NodeJS.Timeout | undefined;
  /** Connections its children are serving now. */
  private active = 0;
  private draining = false;
  private readonly token = `${randomBytes(TOKEN_HEX / 2).toString('hex')}\n`;
  readonly exited: Promise<void>;

  constructor(
    private readonly child: ChildProcess,
    private readonly socket: ServerSocket,
    log: (msg: string, fields?: object) => void,
    private readonly onIdle: () => void,
  ) {
    this.ready = new Promise((resolve) => (this.settleReady = resolve));
    this.exited = new Promise((resolve) => {
      const done = () => {
        if (this.exitedFlag) return;
        this.exitedFlag = true;
        this.settleReady(false);
        clearTimeout(this.idleTimer);
        clearTimeout(this.readyTimer);
        for (const s of sockets(child)) s.destroy();
        closeSync(socket.dirFd);
        void rm(join(socket.dir, socket.name), { force: true })
          .catch(() => undefined)
          .then(() => resolve());
      };
      child.once('exit', done);
      child.once('error', done);
    });
    // The token goes first; stdin then stays open, and its end tells the server to exit.
    child.stdin?.on('error', () => undefined);
    child.stdin?.write(this.token);
    let said = '';
    child.stdout?.on('data', (chunk: Buffer) => {
      if (this.readyFlag) return;
      said = (said + chunk.toString('latin1')).slice(0, 16);
      if (said.startsWith('ready\n')) {
        this.readyFlag = true;
        this.settleReady(true);
        clearTimeout(this.readyTimer);
      }
    });
    this.readyTimer = setTimeout(() => {
      log('warm guest server did not get ready; killing it', { socket: socket.name });
      void this.kill();
    }, READY_MS);
    this.readyTimer.unref();
    // Anything a server or its children write to stderr is a fault worth a log line; a few, since
    // the guest can make a server write (the exec server runs with the guest's capabilities).
    let lines = 0;
    child.stderr?.on('data', (chunk: Buffer) => {
      if (++lines <= STDERR_LOG_LINES) {
        log('warm guest server says', { socket: socket.name, text: chunk.toString('utf8', 0, STDERR_LOG_BYTES) });
      } else if (lines === STDERR_LOG_LINES + 1) {
        log('warm guest server says more; not logged', { socket: socket.name });
      }
    });
    // A server waiting for work must not keep the agent alive.
    child.unref();
    for (const s of sockets(child)) s.unref();
    this.armIdle();
  }

  /** Running and listening: `exit` has not been seen, so its pid (and group id) is not reused yet. */
  get usable(): boolean {
    return this.readyFlag && this.alive;
  }

  /** The host pid of the server's group leader (the process the agent spawned). */
  get pid(): number {
    return this.child.pid as number;
  }

  /** It said `ready` at some point (a server that never did is a failed start). */
  get wasReady(): boolean {
    return this.readyFlag;
  }

  get alive(): boolean {
    return !this.exitedFlag && this.child.pid !== undefined && this.child.exitCode === null && this.child.signalCode === null;
  }

  /**
   * No new work: the server is retired (`onIdle`) once its children have finished what they
   * serve, so a replacement never kills another caller's operation midway.
   */
  retireWhenIdle(): void {
    this.draining = true;
    if (this.active === 0) this.onIdle();
  }

  /** The idle deadline runs only while no connection is open: a long operation keeps its server. */
  private armIdle(): void {
    clearTimeout(this.idleTimer);
    this.idleTimer = setTimeout(this.onIdle, IDLE_MS);
    this.idleTimer.unref();
  }

  private released(): void {
    this.active--;
    if (this.active > 0) return;
    if (this.draining) this.onIdle();
    else this.armIdle();
  }

  /**
   * A connection to a child that took it and checked the token (it answers `+`), paused for the
   * caller; null if none does within ACK_MS: the server is stopped, wedged or gone.
   */
  connect(): Promise<Socket | null> {
    return new Promise((resolve) => {
      const socket = connect({ path: `/proc/self/fd/${this.socket.dirFd}/${this.socket.name}` });
      const fail = () => {
        clearTimeout(timer);
        socket.destroy();
        resolve(null);
      };
      const timer = setTimeout(fail, ACK_MS);
      // Stays attached: a failure later shows as the connection closing, which callers handle.
      socket.on('error', fail);
      socket.once('connect', () => socket.write(this.token));
      socket.once('data', (chunk: Buffer) => {
        socket.pause();
        // The child sends nothing else before it has the request.
        if (chunk.length !== 1 || chunk[0] !== 0x2b) return fail();
        clearTimeout(timer);
        this.active++;
        clearTimeout(this.idleTimer);
        socket.once('close', () => this.released());
        resolve(socket);
      });
    });
  }

  /**
   * Kills the server and everything it started, and waits until none of it runs: what follows may
   * be a dump, or the removal of the desktop's cgroups, which waits for every member to be reaped.
   * So the order is chosen for reaping. The server inside the guest goes first: nsenter, its
   * parent, reaps it and exits, and its children die with it (PR_SET_PDEATHSIG) and are reaped by
   * the guest init. Only then is whatever is left SIGKILLed; killing everything at once would let
   * nsenter die first and leave the server's zombie to the host's init, on that init's schedule.
   */
  async kill(): Promise<void> {
    if (!this.alive) {
      await this.exited;
      return;
    }
    const leader = this.child.pid as number;
    const tree = await processTree(leader);
    const server = tree.length > 1 ? (tree[1] as number) : null;
    if (server !== null) signal(server, 'SIGKILL');
    if (server === null || !(await this.exitedWithin(EXIT_WAIT_MS / 5))) {
      // Not running inside the guest yet, or nsenter did not follow: the whole group at once (its
      // leader not reaped yet, so the group id is still this server's).
      if (this.alive) signal(-leader, 'SIGKILL');
      await this.exitedWithin(EXIT_WAIT_MS);
    }
    // Grandchildren outlive a parent's death (an rm of a recursive delete): by pid, as they are known.
    const running = async () => (await Promise.all(tree.map(procStat))).flatMap((st) => (st === null ? [] : [st.pid]));
    for (const pid of await running()) signal(pid, 'SIGKILL');
    await waitFor(async () => (await running()).length === 0, EXIT_WAIT_MS);
  }

  private async exitedWithin(ms: number): Promise<boolean> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(false), ms)));
    const exited = await Promise.race([this.exited.then(() => true), timeout]);
    clearTimeout(timer);
    return exited;
  }
}

interface DesktopWarm {
  readonly init: InitProcess;
  readonly servers: Partial<Record<WarmKind, WarmServer>>;
  /** When a server of the kind failed to come up: no new one before `RETRY_MS` has passed. */
  readonly failedAt: Partial<Record<WarmKind, number>>;
  /** Replaced servers whose children still serve operations; a retire kills them too. */
  readonly draining: Set<WarmServer>;
}

export class WarmPool {
  private readonly desktops = new Map<string, DesktopWarm>();
  private closed = false;
  private readonly log: (msg: string, fields?: object) => void;

  constructor(private readonly opts: WarmPoolOptions) {
    this.log = opts.log ?? (() => undefined);
  }

  /**
   * A connection to a warm child of `kind` in the guest of `init`, or null: the caller runs cold,
   * and the server is started (or replaced) in the background for the next operation.
   */
  async connect(kind: WarmKind, desktopId: string, init: InitProcess): Promise<WarmConnection | null> {
    if (this.closed || this.opts.fenced(desktopId)) return null;
    const desktop = this.entry(desktopId, init);
    let server = desktop.servers[kind];
    if (server !== undefined && server.alive && !server.wasReady && performance.now() - server.startedAt < STARTING_FRESH_MS) {
      // On its way (started ahead of calls, or by an earlier call that ran cold): wait a little.
      const starting = server;
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([starting.ready, new Promise((resolve) => (timer = setTimeout(resolve, STARTING_WAIT_MS)))]);
      clearTimeout(timer);
      if (this.closed || this.opts.fenced(desktopId) || this.desktops.get(desktopId) !== desktop) return null;
      server = desktop.servers[kind];
    }
    if (server?.usable) {
      const socket = await server.connect();
      if (socket !== null) return { socket, serverPid: server.pid };
      // Alive but not serving: the next operation starts another. This one runs cold at once;
      // the server goes when the operations its children still serve have ended.
      this.log('warm guest server does not answer; replacing it', { desktopId, kind });
      if (desktop.servers[kind] === server) delete desktop.servers[kind];
      desktop.draining.add(server);
      server.retireWhenIdle();
      return null;
    }
    const failedAt = desktop.failedAt[kind];
    if ((server === undefined || !server.alive) && (failedAt === undefined || Date.now() - failedAt > RETRY_MS)) {
      const owner = desktop;
      // After this tick, so the caller's cold start goes first.
      setImmediate(() => this.start(kind, desktopId, owner));
    }
    return null;
  }

  /**
   * Starts the desktop's server of `kind` now, ahead of any call, unless one runs or a start
   * failed lately: for a desktop about to be used (sandbox-lifecycle.ts, after a move).
   */
  prewarm(kind: WarmKind, desktopId: string, init: InitProcess): void {
    if (this.closed || this.opts.fenced(desktopId)) return;
    const desktop = this.entry(desktopId, init);
    const failedAt = desktop.failedAt[kind];
    if (desktop.servers[kind]?.alive || (failedAt !== undefined && Date.now() - failedAt <= RETRY_MS)) return;
    this.start(kind, desktopId, desktop);
  }

  /** The desktop's servers for `init`; those of an earlier init are dropped. */
  private entry(desktopId: string, init: InitProcess): DesktopWarm {
    let desktop = this.desktops.get(desktopId);
    if (desktop !== undefined && (desktop.init.pid !== init.pid || desktop.init.startTime !== init.startTime)) {
      void this.drop(desktop);
      desktop = undefined;
    }
    if (desktop === undefined) {
      desktop = { init, servers: {}, failedAt: {}, draining: new Set() };
      this.desktops.set(desktopId, desktop);
    }
    return desktop;
  }

  /** Kills every server of the desktop and forgets them; resolves once they have exited. */
  async retire(desktopId: string): Promise<void> {
    const desktop = this.desktops.get(desktopId);
    if (desktop === undefined) return;
    this.desktops.delete(desktopId);
    await this.drop(desktop);
  }

  /** Retires everything and starts nothing more. */
  async close(): Promise<void> {
    this.closed = true;
    await Promise.all([...this.desktops.keys()].map((id) => this.retire(id)));
  }

  private start(kind: WarmKind, desktopId: string, desktop: DesktopWarm): void {
    // Checked in the same tick as the spawn: a fence raised before it stops it, and a server
    // started before the fence is in `servers`, where a retire finds it.
    if (this.closed || this.opts.fenced(desktopId) || this.desktops.get(desktopId) !== desktop) return;
    if (desktop.servers[kind]?.alive) return;
    const dir = this.opts.socketDir(desktopId);
    // Random, so a new server never meets the socket of an old one; the kind, for an operator.
    const name = `warm-${kind}-${randomBytes(6).toString('hex')}.sock`;
    let server: WarmServer;
    let dirFd: number | null = null;
    try {
      // Synchronous, like the spawn beside it: opening a local directory does not block.
      dirFd = openSync(dir, 'r');
      const child = this.opts.start(kind, desktopId, desktop.init, dir, name);
      server = new WarmServer(child, { dir, name, dirFd }, this.log, () => void this.stop(desktopId, kind, server));
    } catch (err) {
      if (dirFd !== null) closeSync(dirFd);
      this.log('could not start a warm guest server', { desktopId, kind, error: String(err) });
      return;
    }
    desktop.servers[kind] = server;
    void server.exited.then(() => {
      if (desktop.servers[kind] === server) delete desktop.servers[kind];
      desktop.draining.delete(server);
      if (!server.wasReady) desktop.failedAt[kind] = Date.now();
    });
  }

  private async stop(desktopId: string, kind: WarmKind, server: WarmServer): Promise<void> {
    const desktop = this.desktops.get(desktopId);
    if (desktop?.servers[kind] === server) delete desktop.servers[kind];
    desktop?.draining.delete(server);
    await server.kill();
  }

  private async drop(desktop: DesktopWarm): Promise<void> {
    const all = [...Object.values(desktop.servers), ...desktop.draining];
    for (const kind of Object.keys(desktop.servers) as WarmKind[]) delete desktop.servers[kind];
    desktop.draining.clear();
    await Promise.all(all.map((s) => s.kill()));
  }
}
