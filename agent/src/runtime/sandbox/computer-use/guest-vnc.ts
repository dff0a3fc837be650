/**
 * VNC servers for stream clients: one x11vnc per client, started inside the desktop on demand.
 *
 * x11vnc runs in inetd mode, speaking RFB on a single connected socket given as its stdin and
 * stdout (it reads and writes fd 0, so two pipes would not do). Node has no socketpair, so the
 * agent makes one by listening on a unix socket in a private (0700) directory and connecting to
 * it: the accepted end is the session's `input` and `output`, the other end becomes the server's
 * fd 0 and 1 and is closed in the agent right after the spawn. Nothing listens on a port, in the
 * guest or on the host, and every server serves exactly one client.
 *
 * The server enters the guest the way exec does: the desktop's cgroups first, then `nsenter` into
 * the guest init's namespaces and root, `setpriv` down to the guest's capabilities and `setsid`
 * into a session of its own inside the guest. It therefore has no more power than guest code and
 * counts against the desktop's limits. Its options shut off everything a guest could use against
 * it: no rc file from the guest's home (`-norc`), no remote control through X properties (which
 * would let any X client in the guest turn a view-only server into a controlling one,
 * `-noremote`), no external commands (`-nocmds`).
 *
 * CRIU cannot dump a process holding a socket whose peer is outside the dumped tree, so hibernate
 * calls `closeAll` before the dump: the agent's end is closed (the server sees the end of its
 * input and exits within milliseconds, closing its X connections), a server that is still there
 * after a grace is killed, and the call returns only when every one has exited. Nothing of a
 * server outlives it in the guest, even when it is killed (see `x11vncArgs`), so the snapshot
 * holds no trace of a stream. The driver calls `closeAll` under its fence (in-flight.ts), which
 * refuses new streams until the stop is over: one opened meanwhile would break the dump.
 *
 * A server shows the display at the size it had when the server started. x11vnc 0.9.16 does not
 * notice this X server's RandR resizes; after a shrink it fails its next screen poll and exits,
 * which closes the client's connection, and the next session gets the new size.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { connect, createServer, type Socket } from 'node:net';
import { PassThrough } from 'node:stream';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { AgentFailure } from '../../../../../shared/src/protocol.js';
import type { VncSession } from '../../driver.js';
import { joinArgv, JOIN_FAILED } from '../host/cgroups.js';
import type { InitProcess } from '../host/cold-boot.js';
import { GUEST_CAPS_ONLY, GUEST_ENV, nsenterArgv } from '../guest/guest-init.js';
import { guestFilterArgv } from '../guest/guest-filter.js';
import { isSameProcessSync, killTree, processTree, procStat, waitFor, type ProcStat } from '../host/host-procs.js';

export interface VncSessionsOptions {
  readonly nsenterPath: string;
  /** The desktop's running guest init; rejects with `not_found` / `not_running`. */
  readonly init: (desktopId: string) => Promise<InitProcess>;
  /**
   * True while the desktop is stopping (the driver's in-flight fence, in-flight.ts): nothing new
   * may enter it. Hibernate and destroy raise it before they call `closeAll`.
   */
  readonly fenced: (desktopId: string) => boolean;
  readonly log: (msg: string, fields?: object) => void;
}

/** How long a server gets to send its RFB greeting. */
const START_TIMEOUT_MS = 10_000;
/** How long a closed server gets to exit on its own before it is killed. */
const EXIT_GRACE_MS = 1_000;
/** How long a killed server gets to be gone. */
const KILLED_GONE_MS = 5_000;
const STDERR_KEEP = 2 * 1024;
/** `RFB xxx.yyy\n` */
const GREETING_BYTES = 12;

const X11VNC = '/usr/bin/x11vnc';

/**
 * The server's command line.
 * - `-q`: nothing but errors (in inetd mode it then closes its stderr once it runs).
 * - `-nopw`: the gateway's ticket is the access check. `-once`: it ends with its one client.
 * - `-nonap`: without it an idle server naps, and the first full frame took ≈1 s instead of
 *   ≈35 ms; it also exits ≈4 ms after its client instead of ≈250 ms.
 * - `-noshm`: no SysV shared memory. With it a server holds ≈34 segments (≈5 MB at 1024x768,
 *   charged to the desktop) that stay in the guest's IPC namespace, and in its snapshot, when the
 *   server is killed; polling over the X socket measured no slower here.
 * - `-speeds lan`: skips the link measurement that takes a new server's first ≈5 s, during which
 *   it applied pointer input only at the end and did not notice its client hanging up. The
 *   assumed fast link only tunes x11vnc's heuristics; the gateway's relay applies backpressure.
 * - `-repeat`: leave the X server's key autorepeat alone (x11vnc turns it off while a client is
 *   connected, and a killed server would leave it off for the guest).
 * - `-norc`, `-noremote`, `-nocmds`: see the module comment.
 * - `-viewonly` discards all input, the clipboard's included.
 */
function x11vncArgs(desktopId: string, viewOnly: boolean): string[] {
  return [
    '-inetd', '-display', ':0', '-q', '-nopw', '-once', '-nonap', '-speeds', 'lan', '-noshm', '-repeat', '-norc', '-noremote', '-nocmds',
    '-desktop', desktopId,
    ...(viewOnly ? ['-viewonly'] : []),
  ];
}


/**
 * One x11vnc and the agent's end of its socket. What the server sends passes through `output`
 * (with backpressure), so the agent can see the greeting arrive without taking it off the stream.
 */
class VncServer implements VncSession {
  readonly input: Socket;
  readonly output = new PassThrough();
  readonly closed: Promise<void>;
  private stderr = '';
  private exitCode: number | null = null;
  private exited = false;
  private received = 0;
  private greeted: () => void = () => undefined;
  private killing: Promise<void> | null = null;
  private graceTimer: NodeJS.Timeout | undefined;

  constructor(
    readonly desktopId: string,
    private readonly child: ChildProcess,
    private readonly socket: Socket,
  ) {
    this.input = socket;
    socket.on('error', () => undefined);
    socket.on('data', (chunk: Buffer) => {
      this.received += chunk.length;
      if (this.received >= GREETING_BYTES) this.greeted();
    });
    socket.pipe(this.output);
    // A socket that fails ends without 'end': the reader still gets the end of its stream.
    socket.once('close', () => {
      if (!this.output.writableEnded) this.output.end();
    });
    child.stderr?.on('data', (chunk: Buffer) => {
      if (this.stderr.length < STDERR_KEEP) this.stderr += chunk.toString('utf8').slice(0, STDERR_KEEP);
    });
    const exit = new Promise<void>((resolve) => {
      child.once('error', () => resolve());
      child.once('exit', (code, sig) => {
        this.exitCode = code ?? (sig ? 128 : null);
        resolve();
      });
    });
    this.closed = exit.then(async () => {
      this.exited = true;
      clearTimeout(this.graceTimer);
      // nsenter exits after its child unless it was killed with it: then wait for the rest.
      if (this.killing !== null) await this.killing;
      socket.destroy();
    });
  }

  /** Ends the session: the server sees the end of its input and exits, or is killed after a grace. */
  close(): void {
    this.socket.destroy();
    if (this.exited || this.graceTimer !== undefined) return;
    this.graceTimer = setTimeout(() => void this.kill(), EXIT_GRACE_MS);
    this.graceTimer.unref();
  }

  /**
   * SIGKILLs the server and then nsenter above it (killTree: killed together, the server would be
   * left to the host's init to reap, and a hibernate's dump waits for that) and waits until they
   * are gone.
   */
  kill(): Promise<void> {
    this.killing ??= (async () => {
      if (this.child.pid === undefined || this.exited) return;
      const tree = await processTree(this.child.pid);
      const procs = (await Promise.all(tree.map((pid) => procStat(pid)))).filter((p): p is ProcStat => p !== null);
      await killTree(this.child.pid);
      // A zombie not yet reaped counts as gone.
      await waitFor(() => procs.every((p) => !isSameProcessSync(p.pid, p.startTime)), KILLED_GONE_MS);
    })();
    return this.killing;
  }

  /** Closes, then kills what did not exit within the grace; resolves once the server has exited. */
  async stop(): Promise<void> {
    this.close();
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(true), EXIT_GRACE_MS)));
    if (await Promise.race([this.closed.then(() => false), late])) await this.kill();
    clearTimeout(timer);
    await this.closed;
  }

  /**
   * Waits for the RFB greeting, so that a server that cannot start is reported here instead of
   * as a connection that closes without a word.
   */
  async started(): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    let timedOut = false;
    const ok = await new Promise<boolean>((resolve) => {
      if (this.received >= GREETING_BYTES) resolve(true);
      this.greeted = () => resolve(true);
      timer = setTimeout(() => {
        timedOut = true;
        resolve(false);
      }, START_TIMEOUT_MS);
      void this.closed.then(() => resolve(false));
      this.socket.once('close', () => resolve(false));
    });
    this.greeted = () => undefined;
    clearTimeout(timer);
    if (ok) return;
    await this.kill();
    await this.closed;
    throw this.startFailure(timedOut);
  }

  private startFailure(timedOut: boolean): AgentFailure {
    const detail = this.stderr.trim().split('\n')[0] ?? '';
    // The cgroup prologue failed, or nsenter found no guest init: the desktop stopped under us.
    if (detail.startsWith(JOIN_FAILED) || detail.startsWith('nsenter:')) {
      return new AgentFailure('not_running', `desktop ${this.desktopId} is not running`, false);
    }
    if (timedOut) return new AgentFailure('timeout', `VNC server did not start within ${START_TIMEOUT_MS} ms`, true);
    const code = this.exitCode === null ? '' : ` (exit code ${this.exitCode})`;
    return new AgentFailure('runtime_error', `VNC server did not start${code}${detail ? `: ${detail}` : ''}`, true);
  }
}

export class VncSessions {
  private readonly servers = new Map<string, Set<VncServer>>();
  private dir: Promise<string> | null = null;
  private closing = false;

  constructor(private readonly options: VncSessionsOptions) {}

  async open(desktopId: string, viewOnly: boolean): Promise<VncSession> {
    if (this.closing) throw new AgentFailure('not_running', 'the driver is closing', false);
    const t0 = performance.now();
    const [agentEnd, serverEnd] = await this.socketPair();
    let server: VncServer;
    try {
      const init = await this.options.init(desktopId);
      if (this.options.fenced(desktopId)) throw new AgentFailure('not_running', `desktop ${desktopId} is stopping`, false);
      if (this.closing) throw new AgentFailure('not_running', 'the driver is closing', false);
      // From the fence check to the registration nothing awaits: closeAll sees this server or
      // this call sees the fence.
      server = new VncServer(desktopId, this.spawnServer(desktopId, init, viewOnly, serverEnd), agentEnd);
    } catch (err) {
      agentEnd.destroy();
      throw err;
    } finally {
      serverEnd.destroy();
    }
    this.register(server);
    try {
      await server.started();
    } catch (err) {
      // closeAll stopped it while it started: the desktop is stopping, not broken.
      if (this.options.fenced(desktopId)) throw new AgentFailure('not_running', `desktop ${desktopId} is stopping`, false);
      throw err;
    }
    this.options.log('vnc server started', { desktopId, viewOnly, ms: Math.round(performance.now() - t0) });
    void server.closed.then(() => this.options.log('vnc server exited', { desktopId, viewOnly }));
    return server;
  }

  /**
   * Ends every session of the desktop and waits for their servers to exit. Only for a desktop
   * whose guest is about to stop (hibernate, destroy), under the fence: no session starts meanwhile.
   */
  async closeAll(desktopId: string): Promise<void> {
    const servers = [...(this.servers.get(desktopId) ?? [])];
    await Promise.all(servers.map((s) => s.stop()));
  }

  /** Ends every session (the driver is closing). */
  async close(): Promise<void> {
    this.closing = true;
    const all = [...this.servers.values()].flatMap((set) => [...set]);
    await Promise.all(all.map((s) => s.stop()));
    const dir = await this.dir?.catch(() => null);
    this.dir = null;
    if (dir) await rm(dir, { recursive: true, force: true }).catch(() => undefined);
  }

  private register(server: VncServer): void {
    let set = this.servers.get(server.desktopId);
    if (set === undefined) this.servers.set(server.desktopId, (set = new Set()));
    set.add(server);
    void server.closed.then(() => {
      set.delete(server);
      if (set.size === 0 && this.servers.get(server.desktopId) === set) this.servers.delete(server.desktopId);
    });
  }

  private spawnServer(desktopId: string, init: InitProcess, viewOnly: boolean, serverEnd: Socket): ChildProcess {
    return spawn(
      '/bin/sh',
      [
        ...joinArgv(desktopId, 3),
        ...nsenterArgv(this.options.nsenterPath, init.pid),
        ...guestFilterArgv(),
        ...GUEST_CAPS_ONLY, '/usr/bin/setsid', X11VNC, ...x11vncArgs(desktopId, viewOnly),
      ],
      { env: { ...GUEST_ENV }, stdio: [serverEnd, serverEnd, 'pipe'] },
    );
  }

  /** Two connected ends of a unix stream socket, made through a listener in a private directory. */
  private async socketPair(): Promise<[Socket, Socket]> {
    const listener = createServer({ pauseOnConnect: true });
    let path = '';
    try {
      this.dir ??= mkdtemp(join(tmpdir(), 'canto-vnc-'));
      path = join(await this.dir, `${randomBytes(8).toString('hex')}.sock`);
      await new Promise<void>((resolve, reject) => {
        listener.once('error', reject);
        listener.listen(path, () => resolve());
      });
      const accepted = new Promise<Socket>((resolve) => listener.once('connection', resolve));
      const serverEnd = connect({ path });
      serverEnd.pause();
      // Neither end may crash the agent with an unhandled 'error' before its owner takes it.
      serverEnd.on('error', () => undefined);
      void accepted.then((socket) => socket.on('error', () => undefined));
      await new Promise<void>((resolve, reject) => {
        serverEnd.once('connect', () => resolve());
        serverEnd.once('error', reject);
      });
      return [await accepted, serverEnd];
    } catch (err) {
      // A directory that could not be made is tried again next time.
      if (path === '') this.dir = null;
      throw new AgentFailure('runtime_error', `cannot connect a VNC server: ${String(err)}`, true);
    } finally {
      listener.close();
      if (path !== '') await rm(path, { force: true });
    }
  }
}
