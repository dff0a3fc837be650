/**
 * Connections to TCP ports inside desktops (docs/api.md §4.7): the driver's own (`open`), and the
 * port gateway's links, which go to relays of their own (`handOff`, port-relays.ts) where the
 * process spawner runs and through the forwarder below where it does not.
 *
 * A desktop has its own network namespace with only a loopback, so an app listening on
 * `127.0.0.1:8000` in the guest is reachable only from inside that namespace, and Node cannot
 * enter one. Each running desktop therefore gets one small forwarder process, started on the
 * first connection: it listens on a Unix socket in the desktop's driver-only `run/` directory and
 * sits in the guest's network namespace, so for each connection the agent makes to that socket it
 * connects to `127.0.0.1:<port>` there and relays bytes both ways.
 *
 * The forwarder enters the network namespace only (`nsenter -n`): it stays in the host's mount
 * namespace, where the socket's path is, and outside the guest's pid namespace, so the guest
 * cannot see or signal it and CRIU never dumps it. Before that it joins the desktop's cgroups, so
 * its memory and processes count against the desktop's limits, and after it, it drops to `nobody`
 * with no capabilities and no_new_privs: it holds connections to guest code and needs nothing.
 *
 * Why Perl and one process per connection: measured here, an idle Perl forwarder is 5.5 MB RSS
 * (2.3 MB PSS, the rest is libperl shared with every other Perl) and each open connection adds a
 * forked child of 0.5 MB PSS, while the same forwarder in Node was 45 MB RSS (26 MB PSS) before
 * its first connection, charged to the desktop's memory limit. Both opened a connection in about
 * 1 ms and relayed 400-600 MB/s. A child per connection keeps the relay a plain poll loop over
 * two non-blocking sockets, and a connect that hangs (a full listen backlog) stalls only its own
 * connection.
 *
 * Protocol on the Unix socket: the agent sends the port as two bytes (big-endian); the forwarder
 * answers one byte, 0 once connected or the connect's errno (ECONNREFUSED when nothing listens),
 * and from then on the socket carries the guest connection's bytes. Each side's end is passed on
 * as a half-close (shutdown), and the child exits once both directions have ended.
 *
 * Lifetime. A forwarder belongs to one guest init (pid and start time): a desktop that started
 * again gets a new one. One that died is replaced on the next connection; one without connections
 * for ten minutes is retired. `closeAll`, which the driver calls before a CRIU dump and a destroy
 * (while its fence keeps new connections out) and when a desktop starts, closes the agent's ends of its connections, kills the forwarder's process group and returns once every
 * process of it is gone. The forwarder also dies with the agent (its stdin ends and it has
 * PR_SET_PDEATHSIG), so none outlives the agent that started it.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { closeSync, openSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { connect, type Socket } from 'node:net';
import { constants as osc } from 'node:os';
import { join } from 'node:path';
import { AgentFailure } from '../../../../../shared/src/protocol.js';
import { cgroupPids, JOIN_FAILED, joinArgv } from '../host/cgroups.js';
import type { InitProcess } from '../host/cold-boot.js';
import { procStatSync, signal, waitFor } from '../host/host-procs.js';
import { warmPrologue } from '../guest/warm-perl.js';
import { forwarderProgram } from './guest-ports-perl.js';
import { PortRelays } from './port-relays.js';
import type { HandedOffLink } from '../../driver.js';

export interface GuestPortsOptions {
  readonly nsenterPath: string;
  /** The desktop's running guest init; rejects with `not_found` / `not_running`. */
  readonly init: (desktopId: string) => Promise<InitProcess>;
  /** The desktop's driver-only directory (`run/`), where the forwarder's socket goes. */
  readonly socketDir: (desktopId: string) => string;
  /**
   * True while the desktop is stopping (the driver's in-flight fence, in-flight.ts): nothing new
   * may enter it. Hibernate and destroy raise it before they call `closeAll`.
   */
  readonly fenced: (desktopId: string) => boolean;
  readonly log: (msg: string, fields?: object) => void;
  /** The built canto-spawn, whose relays carry the gateway's links (port-relays.ts); null: none. */
  readonly relayProgram?: string | null;
}

/** How long a new forwarder gets to say `ready`. */
const READY_MS = 10_000;
/** How long a connect inside the guest may take (the forwarder's child gives up a little later). */
const CONNECT_MS = 10_000;
/** A forwarder without connections for this long is retired. */
const IDLE_MS = 10 * 60_000;
/** Bound on waiting for a killed forwarder and its children to be gone. */
const GONE_MS = 5_000;
const STDERR_KEEP = 1024;
/** The forwarder runs as `nobody`. */
const NOBODY = 65534;

/** A failed connect inside the guest, coded like Node's own (`ECONNREFUSED`, ...). */
function connectError(errno: number, port: number): Error {
  const code = Object.entries(osc.errno).find(([, n]) => n === errno)?.[0] ?? 'EIO';
  return Object.assign(new Error(`connect ${code} 127.0.0.1:${port} in the guest`), { code, errno: -errno, syscall: 'connect' });
}

/** Processes of the desktop's cgroups in process group `pgid`, zombies left out. */
async function groupMembers(desktopId: string, pgid: number): Promise<number[]> {
  const out: number[] = [];
  for (const pid of await cgroupPids(desktopId)) {
    if (procStatSync(pid)?.pgid === pgid) out.push(pid);
  }
  return out;
}

/** One desktop's forwarder and the agent's ends of its connections. */
class Forwarder {
  readonly ready: Promise<void>;
  readonly exited: Promise<void>;
  private readonly connections = new Set<Socket>();
  private exitedFlag = false;
  private stderr = '';
  private idleTimer: NodeJS.Timeout | undefined;
  private killing: Promise<void> | null = null;

  constructor(
    readonly desktopId: string,
    readonly init: InitProcess,
    private readonly child: ChildProcess,
    private readonly dir: string,
    private readonly dirFd: number,
    private readonly name: string,
    private readonly onIdle: () => void,
  ) {
    this.exited = new Promise((resolve) => {
      const done = () => {
        if (this.exitedFlag) return;
        this.exitedFlag = true;
        clearTimeout(this.idleTimer);
        for (const s of [child.stdin, child.stdout, child.stderr]) s?.destroy();
        closeSync(dirFd);
        void rm(join(dir, name), { force: true }).catch(() => undefined).then(() => resolve());
      };
      child.once('exit', done);
      child.once('error', done);
    });
    child.stdin?.on('error', () => undefined);
    child.stderr?.on('data', (chunk: Buffer) => {
      if (this.stderr.length < STDERR_KEEP) this.stderr += chunk.toString('utf8').slice(0, STDERR_KEEP);
    });
    this.ready = new Promise<void>((resolve, reject) => {
      let said = '';
      const timer = setTimeout(() => {
        void this.kill();
        reject(new AgentFailure('timeout', `the port forwarder of ${desktopId} did not start within ${READY_MS} ms`, true));
      }, READY_MS);
      // Not unref'd: a caller is waiting, and the forwarder's own handles are.
      child.stdout?.on('data', (chunk: Buffer) => {
        said = (said + chunk.toString('latin1')).slice(0, 16);
        if (said.startsWith('ready\n')) {
          clearTimeout(timer);
          resolve();
        }
      });
      void this.exited.then(() => {
        clearTimeout(timer);
        reject(this.startFailure());
      });
    });
    // Handled by whoever awaits it; a forwarder nobody waits for must not raise an unhandled rejection.
    this.ready.catch(() => undefined);
    // A forwarder waiting for connections must not keep the agent alive.
    child.unref();
    for (const s of [child.stdin, child.stdout, child.stderr]) (s as Socket | null)?.unref();
    this.armIdle();
  }

  get alive(): boolean {
    return !this.exitedFlag && this.killing === null && this.child.exitCode === null && this.child.signalCode === null;
  }

  /** A connection to the guest port, with the forwarder's status byte taken off. */
  connect(port: number): Promise<Socket> {
    return new Promise((resolve, reject) => {
      const socket = connect({ path: `/proc/self/fd/${this.dirFd}/${this.name}`, allowHalfOpen: true });
      let settled = false;
      const fail = (err: Error) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        socket.destroy();
        reject(err);
      };
      const timer = setTimeout(
        () => fail(new AgentFailure('timeout', `guest port ${port} did not accept within ${CONNECT_MS} ms`, true)),
        CONNECT_MS,
      );
      timer.unref();
      // Stays attached: later errors show as the connection closing, which the caller handles.
      socket.on('error', (err) => fail(new AgentFailure('runtime_error', `cannot reach the port forwarder: ${err.message}`, true)));
      socket.once('close', () => fail(new AgentFailure('runtime_error', 'the port forwarder closed the connection', true)));
      socket.once('connect', () => socket.write(Buffer.from([port >> 8, port & 0xff])));
      // 'readable' and read(1) take the status byte alone and leave the stream as a fresh socket's
      // (not flowing until someone reads), with the guest's first bytes still in it.
      const onReadable = () => {
        const head = socket.read(1) as Buffer | null;
        if (head === null) return;
        socket.off('readable', onReadable);
        const status = head[0] as number;
        if (status !== 0) return fail(connectError(status, port));
        settled = true;
        clearTimeout(timer);
        this.track(socket);
        resolve(socket);
      };
      socket.on('readable', onReadable);
    });
  }

  /**
   * Closes the agent's ends of the connections (the gateway resets its clients), SIGKILLs the
   * forwarder's process group (the forwarder and every connection's child at once) and waits
   * until none of it runs.
   */
  kill(): Promise<void> {
    this.killing ??= (async () => {
      clearTimeout(this.idleTimer);
      for (const s of this.connections) s.destroy();
      const leader = this.child.pid;
      // Before any await: until its exit is seen the leader is unreaped, so the group id is ours.
      if (leader !== undefined && !this.exitedFlag) signal(-leader, 'SIGKILL');
      // A ref'd timer: the forwarder's own handles are unref'd, and a caller is waiting.
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([this.exited, new Promise((r) => (timer = setTimeout(r, GONE_MS)))]);
      clearTimeout(timer);
      if (leader !== undefined) {
        await waitFor(async () => (await groupMembers(this.desktopId, leader)).length === 0, GONE_MS);
      }
    })();
    return this.killing;
  }

  private track(socket: Socket): void {
    this.connections.add(socket);
    clearTimeout(this.idleTimer);
    socket.once('close', () => {
      this.connections.delete(socket);
      if (this.connections.size === 0) this.armIdle();
    });
  }

  private armIdle(): void {
    clearTimeout(this.idleTimer);
    if (this.exitedFlag) return;
    this.idleTimer = setTimeout(this.onIdle, IDLE_MS);
    this.idleTimer.unref();
  }

  private startFailure(): AgentFailure {
    const detail = this.stderr.trim().split('\n')[0] ?? '';
    // The cgroup prologue failed, or nsenter found no guest init: the desktop stopped under us.
    if (detail.startsWith(JOIN_FAILED) || detail.startsWith('nsenter:') || this.killing !== null) {
      return new AgentFailure('not_running', `desktop ${this.desktopId} is not running`, false);
    }
    return new AgentFailure('runtime_error', `the port forwarder did not start${detail ? `: ${detail}` : ''}`, true);
  }
}

export class GuestPorts {
  private readonly forwarders = new Map<string, Forwarder>();
  private readonly relays: PortRelays | null;
  private closing = false;

  constructor(private readonly options: GuestPortsOptions) {
    this.relays = options.relayProgram ? new PortRelays(options.relayProgram) : null;
  }

  /** A connection to `127.0.0.1:<port>` in the desktop's network namespace (RuntimeDriver.openGuestPort). */
  async open(desktopId: string, port: number): Promise<Socket> {
    const init = await this.admit(desktopId, port);
    // From the fence check to the registration nothing awaits: closeAll sees this forwarder or
    // this call sees the fence.
    const forwarder = this.forwarderFor(desktopId, init);
    try {
      await forwarder.ready;
      return await forwarder.connect(port);
    } catch (err) {
      // closeAll stopped the forwarder meanwhile: the desktop is stopping, not broken.
      if (this.options.fenced(desktopId)) throw stopping(desktopId);
      throw err;
    }
  }

  /**
   * Hands `client`, a port link whose line verified, to a relay into the port (RuntimeDriver.
   * handOffGuestPort); null when this host has no relays. Rejects as `open` does when the desktop
   * does not run here, the client then still the caller's; a refused port is the relay's to answer.
   */
  async handOff(desktopId: string, port: number, client: Socket): Promise<HandedOffLink | null> {
    if (this.relays === null) return null;
    const init = await this.admit(desktopId, port);
    // From the fence check in admit to the registration in start nothing awaits, as in open.
    return this.relays.start(desktopId, init, port, client);
  }

  /** The desktop's running init, once the port is valid and the desktop may be entered. */
  private async admit(desktopId: string, port: number): Promise<InitProcess> {
    if (!Number.isInteger(port) || port < 1 || port > 65535) throw new AgentFailure('bad_request', `invalid port ${port}`, false);
    if (this.closing) throw new AgentFailure('not_running', 'the driver is closing', false);
    const init = await this.options.init(desktopId);
    if (this.options.fenced(desktopId) || this.closing) throw stopping(desktopId);
    return init;
  }

  /**
   * Ends every connection into the desktop and waits until its forwarder is gone: for a desktop
   * whose guest is about to stop (hibernate, destroy, under the fence, so no new connection enters
   * meanwhile), and when a desktop starts, to drop a forwarder of an earlier init.
   */
  async closeAll(desktopId: string): Promise<void> {
    const forwarder = this.forwarders.get(desktopId);
    this.forwarders.delete(desktopId);
    await Promise.all([forwarder?.kill(), this.relays?.closeAll(desktopId)]);
  }

  /** Kills every forwarder (the driver is closing; the agent's clients are gone with it). */
  async close(): Promise<void> {
    this.closing = true;
    const all = [...this.forwarders.values()];
    this.forwarders.clear();
    await Promise.all([...all.map((f) => f.kill()), this.relays?.close()]);
  }

  /** The desktop's forwarder for this init, started (synchronously) when there is none alive. */
  private forwarderFor(desktopId: string, init: InitProcess): Forwarder {
    const current = this.forwarders.get(desktopId);
    if (current?.alive && current.init.pid === init.pid && current.init.startTime === init.startTime) return current;
    // Dead, or in the namespaces of an earlier init.
    if (current !== undefined) void current.kill();
    const dir = this.options.socketDir(desktopId);
    // Random, so a new forwarder never meets the socket of an old one.
    const name = `ports-${randomBytes(6).toString('hex')}.sock`;
    let dirFd: number | null = null;
    let forwarder: Forwarder;
    try {
      // Synchronous, like the spawn beside it: opening a local directory does not block.
      dirFd = openSync(dir, 'r');
      forwarder = new Forwarder(desktopId, init, this.spawn(desktopId, init, dir, name), dir, dirFd, name, () => {
        if (this.forwarders.get(desktopId) === forwarder) this.forwarders.delete(desktopId);
        this.options.log('idle port forwarder retired', { desktopId });
        void forwarder.kill();
      });
    } catch (err) {
      if (dirFd !== null) closeSync(dirFd);
      throw new AgentFailure('runtime_error', `cannot start the port forwarder: ${String(err)}`, true);
    }
    this.forwarders.set(desktopId, forwarder);
    void forwarder.exited.then(() => {
      if (this.forwarders.get(desktopId) === forwarder) this.forwarders.delete(desktopId);
    });
    const t0 = performance.now();
    forwarder.ready.then(
      () => this.options.log('port forwarder started', { desktopId, ms: Math.round(performance.now() - t0) }),
      (err: unknown) => this.options.log('port forwarder did not start', { desktopId, error: String(err) }),
    );
    return forwarder;
  }

  /**
   * The prologue joins the desktop's cgroups and binds the socket as root on the host, then
   * nsenter enters the guest's network namespace and setpriv drops to nobody before the forwarder
   * runs. Each step execs the next, so the forwarder is this child itself; it leads its own
   * process group (detached), which its connections' children share.
   */
  private spawn(desktopId: string, init: InitProcess, dir: string, name: string): ChildProcess {
    return spawn(
      '/bin/sh',
      [
        ...joinArgv(desktopId, 3), '/usr/bin/perl', '-e', warmPrologue(), '--', dir, name,
        this.options.nsenterPath, '-t', String(init.pid), '-n',
        '/usr/bin/setpriv', `--reuid=${NOBODY}`, `--regid=${NOBODY}`, '--clear-groups', '--inh-caps=-all', '--bounding-set=-all', '--no-new-privs',
        '/usr/bin/perl', '-e', forwarderProgram(), '--', desktopId,
      ],
      { env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin' }, stdio: ['pipe', 'pipe', 'pipe'], detached: true },
    );
  }
}

function stopping(desktopId: string): AgentFailure {
  return new AgentFailure('not_running', `desktop ${desktopId} is stopping`, false);
}
