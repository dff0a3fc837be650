/**
 * Warm servers: per running desktop, one process for file operations and one for exec that have
 * already entered the guest and hand each operation to a child forked there (warm-perl.ts). The
 * exec server serves only hosts whose cold calls go through the chain of programs: where they
 * enter natively, a cold exec is as fast and none is started (guest-entry.ts).
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
import { randomBytes } from 'node:crypto';
import { closeSync, openSync } from 'node:fs';
import type { Socket } from 'node:net';
import type { InitProcess } from './cold-boot.js';
import type { SpawnedProcess } from './spawner.js';
import { WarmServer } from './warm-server.js';
import type { RuntimeLog } from '../runtime-log.js';

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
  readonly start: (kind: WarmKind, desktopId: string, init: InitProcess, socketDir: string, socketName: string) => Promise<SpawnedProcess>;
  /** The directory for the desktop's sockets: one only the driver (root) can reach. */
  readonly socketDir: (desktopId: string) => string;
  /** True while the desktop is stopping: nothing new may enter it. */
  readonly fenced: (desktopId: string) => boolean;
  readonly log?: RuntimeLog;
}

/**
 * How long an operation waits for a server that is starting before it runs cold. A server comes
 * up in about the time a cold helper takes (both fork the agent and enter the guest), so waiting
 * for one already on its way is never slower by much, and spares a second start.
 */
const STARTING_WAIT_MS = 150;
/** A server not ready this long after its spawn is not waited for (it may be stuck: warm-server.ts). */
const STARTING_FRESH_MS = 1_000;
/** After a server failed to come up, operations on the desktop run cold this long before another try. */
const RETRY_MS = 5_000;

interface DesktopWarm {
  readonly init: InitProcess;
  readonly servers: Partial<Record<WarmKind, WarmServer>>;
  /** When a server of the kind failed to come up: no new one before `RETRY_MS` has passed. */
  readonly failedAt: Partial<Record<WarmKind, number>>;
  /** Replaced servers whose children still serve operations; a retire kills them too. */
  readonly draining: Set<WarmServer>;
  /** Kills under way of servers that stopped on their own (idle after a replacement): a retire waits for them. */
  readonly stopping: Set<Promise<void>>;
}

export class WarmPool {
  private readonly desktops = new Map<string, DesktopWarm>();
  private closed = false;
  private readonly log: RuntimeLog;

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
      this.log('warm guest server does not answer; replacing it', { desktopId, kind }, 'warn');
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
      desktop = { init, servers: {}, failedAt: {}, draining: new Set(), stopping: new Set() };
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
    // Checked in the same tick as the server is asked for: a fence raised before it stops it, and
    // a server asked for before the fence is in `servers` (still starting, perhaps), where a
    // retire finds it.
    if (this.closed || this.opts.fenced(desktopId) || this.desktops.get(desktopId) !== desktop) return;
    if (desktop.servers[kind]?.alive) return;
    const dir = this.opts.socketDir(desktopId);
    // Random, so a new server never meets the socket of an old one; the kind, for an operator.
    const name = `warm-${kind}-${randomBytes(6).toString('hex')}.sock`;
    let server: WarmServer;
    let dirFd: number | null = null;
    try {
      // Synchronous, to hold the server in the same tick: opening a local directory does not block.
      dirFd = openSync(dir, 'r');
      const child = this.opts.start(kind, desktopId, desktop.init, dir, name);
      server = new WarmServer(child, { dir, name, dirFd }, this.log, () => void this.stop(desktopId, kind, server));
    } catch (err) {
      if (dirFd !== null) closeSync(dirFd);
      this.log('could not start a warm guest server', { desktopId, kind, error: String(err) }, 'warn');
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
    const killing = server.kill();
    desktop?.stopping.add(killing);
    try {
      await killing;
    } finally {
      desktop?.stopping.delete(killing);
    }
  }

  private async drop(desktop: DesktopWarm): Promise<void> {
    const all = [...Object.values(desktop.servers), ...desktop.draining];
    for (const kind of Object.keys(desktop.servers) as WarmKind[]) delete desktop.servers[kind];
    desktop.draining.clear();
    // A server already being killed is waited for too: a retire that returned while one still ran
    // would let a dump or a cgroup removal meet it.
    await Promise.all([...all.map((s) => s.kill()), ...desktop.stopping]);
  }
}
