/**
 * One warm guest server as the agent holds it (warm-pool.ts): the process it spawned (nsenter,
 * then the server inside the guest), its socket, whether it said `ready`, the connections its
 * children serve, its idle deadline, and how to kill it so that everything it started is reaped.
 */
import { randomBytes } from 'node:crypto';
import { closeSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { connect, type Socket } from 'node:net';
import { join } from 'node:path';
import { processTree, procStat, signal, waitFor } from './host-procs.js';
import type { SpawnedProcess } from './spawner.js';
import { TOKEN_HEX } from '../guest/warm-perl.js';

/** An unused server is retired after this long. */
const IDLE_MS = 10 * 60_000;
/** A server not ready after this long is stuck (it compiles and forks in milliseconds). */
const READY_MS = 10_000;
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
export interface ServerSocket {
  readonly dir: string;
  readonly name: string;
  readonly dirFd: number;
}

function sockets(child: SpawnedProcess): Socket[] {
  return [child.stdin, child.stdout, child.stderr].filter((s) => s !== null) as Socket[];
}

export class WarmServer {
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
  /** The process, once started (a start takes a fraction of a millisecond, spawner.ts). */
  private child: SpawnedProcess | null = null;
  /** Settles with the process once started, null if it could not be. */
  private readonly spawned: Promise<SpawnedProcess | null>;

  /**
   * Takes the server as it is being started: the pool holds it (and can kill it) from the moment
   * it asked for it, so a retire never misses one still starting.
   */
  constructor(
    starting: Promise<SpawnedProcess>,
    private readonly socket: ServerSocket,
    log: (msg: string, fields?: object) => void,
    private readonly onIdle: () => void,
  ) {
    this.ready = new Promise((resolve) => (this.settleReady = resolve));
    let done!: () => void;
    this.exited = new Promise((resolve) => {
      done = () => {
        if (this.exitedFlag) return;
        this.exitedFlag = true;
        this.settleReady(false);
        clearTimeout(this.idleTimer);
        clearTimeout(this.readyTimer);
        if (this.child !== null) for (const s of sockets(this.child)) s.destroy();
        closeSync(socket.dirFd);
        void rm(join(socket.dir, socket.name), { force: true })
          .catch(() => undefined)
          .then(() => resolve());
      };
    });
    this.spawned = starting.then(
      (child) => {
        this.child = child;
        child.once('exit', done);
        child.once('error', done);
        this.attach(child, log);
        return child;
      },
      (err: unknown) => {
        log('could not start a warm guest server', { socket: socket.name, error: String(err) });
        done();
        return null;
      },
    );
    this.readyTimer = setTimeout(() => {
      log('warm guest server did not get ready; killing it', { socket: socket.name });
      void this.kill();
    }, READY_MS);
    this.readyTimer.unref();
    this.armIdle();
  }

  private attach(child: SpawnedProcess, log: (msg: string, fields?: object) => void): void {
    const socket = this.socket;
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
  }

  /** Running and listening: `exit` has not been seen, so its pid (and group id) is not reused yet. */
  get usable(): boolean {
    return this.readyFlag && this.alive;
  }

  /** The host pid of the server's group leader (the process the agent spawned). */
  get pid(): number {
    return this.child?.pid as number;
  }

  /** It said `ready` at some point (a server that never did is a failed start). */
  get wasReady(): boolean {
    return this.readyFlag;
  }

  /** Not exited (a server still starting counts: it is on its way). */
  get alive(): boolean {
    const child = this.child;
    return !this.exitedFlag && (child === null || (child.pid !== undefined && child.exitCode === null && child.signalCode === null));
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
    const child = await this.spawned;
    if (child === null || !this.alive) {
      await this.exited;
      return;
    }
    const leader = child.pid as number;
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
