/**
 * Starting processes without forking the agent.
 *
 * Node starts a child by forking its own process, and fork copies the page tables of all the
 * agent's resident memory: at the agent's 100-250 MB that blocks its event loop for 4-25 ms on this
 * machine kind per child, and a move or a burst of wakes starts many. The spawner hands each
 * start to a small helper process (agent/native/canto-spawn.c), which uses posix_spawn: no page
 * tables are copied and a start costs the agent a fraction of a millisecond.
 *
 * A child's piped stdio streams are unix socket connections to the helper (which passes each to
 * the child as its fd and keeps no copy), so the agent holds ordinary `net.Socket`s, as it does
 * for the pipes of a Node child. The helper reports each child's pid and its exit over its
 * stdout (spawned-process.ts gives such a child the shape of Node's `ChildProcess`). A socket the
 * agent holds (a port gateway's client) reaches a child over Node's IPC channel to the helper,
 * the one way Node passes a descriptor to another process (agent/native/handoff.c). Where the
 * helper is not built (no C compiler on the host) or cannot start, processes start with Node's
 * own spawn: slower, otherwise the same.
 */
import { spawn as nodeSpawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { connect, type Socket } from 'node:net';
import { dirname, join } from 'node:path';
import { constants, tmpdir } from 'node:os';
import { fileURLToPath } from 'node:url';
import { procStatSync } from './host-procs.js';
import { SOCKET_DIR_PREFIX, sweepStaleSockets } from './spawner-sockets.js';
import { HelperChild, stopReading, type SpawnedProcess, type SpawnOptions } from './spawned-process.js';
import { runtimeSwitch } from '../../../env-switch.js';

export type { SpawnedProcess, SpawnOptions, StdioMode } from './spawned-process.js';

const FLAG_SETSID = 1;
const FLAG_HANDLE = 2;
const MODE_NULL = 0;
const MODE_OWN = 1;
const MODE_HANDLE = 2;
const MODE_CONN = 0x10;
const ATTACH_BIT = 0x80000000;
const EVENT_BYTES = 16;
/** How often children are looked for after the helper died (their exits can no longer be heard). */
const ORPHAN_POLL_MS = 200;

const SIGNAL_NAMES = new Map<number, NodeJS.Signals>(
  Object.entries(constants.signals).map(([name, n]) => [n, name as NodeJS.Signals]),
);

/** The built helper, beside the bundle (dist/) or, when running from source, in the repo's dist/. */
export function helperPath(): string | null {
  const here = dirname(fileURLToPath(import.meta.url));
  const candidates = [join(here, 'canto-spawn'), join(here, '..', '..', '..', '..', '..', 'dist', 'canto-spawn')];
  return candidates.find((p) => existsSync(p)) ?? null;
}

interface Waiting {
  readonly child: HelperChild;
  readonly file: string;
  readonly settle: (err: Error | null) => void;
}

/** One running helper: the requests it has not answered and the children it has not reaped. */
class HelperSpawner {
  private nextId = 1;
  private readonly waiting = new Map<number, Waiting>();
  private readonly running = new Map<number, HelperChild>();
  private pending: Buffer = Buffer.alloc(0);
  private references = 0;
  dead = false;

  private constructor(
    private readonly helper: ChildProcess,
    readonly address: string,
  ) {
    const events = helper.stdout as Socket;
    events.on('data', (chunk: Buffer) => this.read(chunk));
    events.once('close', () => this.died());
    helper.once('exit', () => this.died());
    helper.stdin?.on('error', () => undefined);
  }

  /** Starts the helper and waits for it to listen; null when it cannot start. */
  static async start(path: string): Promise<HelperSpawner | null> {
    await sweepStaleSockets();
    // A directory only the agent's user can enter (mkdtemp makes it 0700), for a short socket path.
    const address = join(await mkdtemp(join(tmpdir(), SOCKET_DIR_PREFIX)), 's');
    // A session of its own: a Ctrl-C at the terminal of `canto up` must not end it while the
    // agent, stopping, still hibernates desktops.
    const helper = nodeSpawn(path, [address], { stdio: ['pipe', 'pipe', 'inherit', 1, 'ipc'], detached: true });
    const ready = new Promise<boolean>((resolve) => {
      const events = helper.stdout as Socket;
      let got = Buffer.alloc(0);
      const onData = (chunk: Buffer) => {
        got = Buffer.concat([got, chunk]);
        if (got.length < EVENT_BYTES) return;
        events.off('data', onData);
        resolve(got.readUInt32LE(4) === 'R'.charCodeAt(0));
      };
      events.on('data', onData);
      helper.once('error', () => resolve(false));
      helper.once('exit', () => resolve(false));
    });
    if (!(await ready)) {
      process.emitWarning(`the process spawner ${path} did not start; processes start with Node's spawn`);
      helper.kill('SIGKILL');
      await rm(dirname(address), { recursive: true, force: true });
      return null;
    }
    helper.unref();
    helper.channel?.unref();
    (helper.stdin as Socket).unref();
    const spawner = new HelperSpawner(helper, address);
    spawner.release();
    return spawner;
  }

  async spawn(file: string, args: readonly string[], options: SpawnOptions): Promise<SpawnedProcess> {
    if (this.dead) throw new Error('the process spawner exited');
    const id = this.nextId++;
    // One connection per piped stream; the first carries the request (a request-only one when
    // nothing is piped, closed by the helper once the child is started).
    const piped = [0, 1, 2].filter((fd) => options.stdio[fd] === 'pipe');
    // A connection that fails fails the start, not the agent: the helper died, or it could not
    // take the connection (a refused one never reaches it, and the start would wait for good).
    const onread = (fd: number) => (fd === 1 && options.stdoutOnread !== undefined ? { onread: options.stdoutOnread } : {});
    const conns = (piped.length === 0 ? [-1] : piped).map((fd) =>
      connect({ path: this.address, ...onread(fd) }).on('error', (err: NodeJS.ErrnoException) => this.notStarted(id, err.code)));
    const modes = options.stdio.map((mode, fd) => {
      if (fd === 1 && options.socket !== undefined) return MODE_HANDLE;
      if (mode === 'pipe') return MODE_CONN + piped.indexOf(fd);
      return mode === 'inherit' && fd > 0 ? MODE_OWN : MODE_NULL;
    });
    const streamOf = (fd: number) => (piped.includes(fd) ? conns[piped.indexOf(fd)]! : null);
    // Output streams are not read until their consumer asks: a socket otherwise reads (0 bytes)
    // as it connects, and a child that has already ended without output then emits `end` before
    // the caller, resumed only once the child has started, is listening.
    const outputs = [streamOf(1), streamOf(2)].filter((s) => s !== null);
    for (const s of outputs) s.pause();
    const child = new HelperChild(this, streamOf(0), streamOf(1), streamOf(2), piped.includes(1) && options.stdoutOnread !== undefined);
    this.references++;
    (this.helper.stdout as Socket).ref();
    conns[0]!.write(requestFrame(id, file, args, options, modes as [number, number, number], conns.length));
    conns.slice(1).forEach((c, k) => c.write(attachFrame(id, k + 1)));
    if (piped.length === 0) conns[0]!.resume();
    const settled = new Promise<Error | null>((resolve) => this.waiting.set(id, { child, file, settle: resolve }));
    if (options.socket !== undefined) this.handOver(id, options.socket);
    const err = await settled;
    if (err !== null) {
      for (const c of conns) c.destroy();
      throw err;
    }
    // Back to a new stream's state (neither flowing nor paused): a `data` listener or a pipe
    // starts the reading.
    for (const s of outputs) (s as { readableFlowing: boolean | null }).readableFlowing = null;
    return child;
  }

  /**
   * Sends `socket` over the IPC channel for request `id`. Kept open here (`keepOpen`) until the
   * child has it, so that a start that fails can still be answered on it; a send that fails (the
   * helper is gone) fails the start.
   */
  private handOver(id: number, socket: Socket): void {
    stopReading(socket);
    this.helper.send({ id }, socket, { keepOpen: true }, (err) => {
      if (err !== null) this.notStarted(id, 'EPIPE');
    });
  }

  /** A child no longer holds the agent's event loop open (exited, or unref'd). */
  release(): void {
    this.references = Math.max(0, this.references - 1);
    if (this.references === 0) (this.helper.stdout as Socket).unref();
  }

  private read(chunk: Buffer): void {
    this.pending = this.pending.length === 0 ? chunk : Buffer.concat([this.pending, chunk]);
    let at = 0;
    for (; at + EVENT_BYTES <= this.pending.length; at += EVENT_BYTES) {
      const id = this.pending.readUInt32LE(at);
      const type = String.fromCharCode(this.pending.readUInt32LE(at + 4));
      const a = this.pending.readInt32LE(at + 8);
      const b = this.pending.readInt32LE(at + 12);
      this.event(id, type, a, b);
    }
    this.pending = this.pending.subarray(at);
  }

  /** A start whose connection or handed socket failed, answered as the helper answers one (a no-op once answered). */
  private notStarted(id: number, code: string | undefined): void {
    this.event(id, 'E', constants.errno[code as keyof typeof constants.errno] ?? constants.errno.EIO, 0);
  }

  private event(id: number, type: string, a: number, b: number): void {
    if (type === 'S' || type === 'E') {
      const w = this.waiting.get(id);
      if (w === undefined) return;
      this.waiting.delete(id);
      if (type === 'S') {
        w.child.pid = a;
        this.running.set(id, w.child);
      } else {
        w.child.failed(a, w.file);
      }
      w.settle(null);
    } else if (type === 'X') {
      const child = this.running.get(id);
      if (child === undefined) return;
      this.running.delete(id);
      // Not in this turn: the exit of a short process can come in the same read as its start,
      // before the caller, resumed by the start, has attached its listeners (Node's spawn
      // never reports an exit before the caller has the child either).
      setImmediate(() => child.exit(a >= 0 ? a : null, a >= 0 ? null : (SIGNAL_NAMES.get(b) ?? null)));
    }
  }

  /**
   * The helper is gone: requests it did not answer fail, and its children (now reaped by
   * whoever adopted them) are watched until they are gone, their exit status unknown.
   */
  private died(): void {
    if (this.dead) return;
    this.dead = true;
    for (const w of this.waiting.values()) w.settle(new Error('the process spawner exited before starting the process'));
    this.waiting.clear();
    const orphans = [...this.running.values()];
    this.running.clear();
    if (orphans.length === 0) return;
    const timer = setInterval(() => {
      // A zombie counts as gone: whoever adopted it reaps it on its own schedule.
      for (const child of orphans) if (procStatSync(child.pid!) === null) child.exit(null, null);
      if (orphans.every((c) => c.exited)) clearInterval(timer);
    }, ORPHAN_POLL_MS);
  }

  get pid(): number {
    return this.helper.pid as number;
  }
}

/**
 * Refuses a NUL in anything a request frame carries, as Node's own spawn does. The frame separates
 * its strings with NULs and counts them: a NUL inside an argument would shift its tail into the
 * environment of the root process the spawner starts (an `LD_PRELOAD=` there runs a guest's file
 * as the host's root). Every caller checks what it is given already; this is the one place that
 * cannot be bypassed.
 */
function refuseNul(file: string, args: readonly string[], options: SpawnOptions): void {
  const env = Object.entries(options.env ?? {}).flatMap(([k, v]) => (v === undefined ? [k] : [k, v]));
  for (const [what, value] of [['file', file], ['cwd', options.cwd ?? ''], ...args.map((a, i) => [`args[${i}]`, a]), ...env.map((e) => ['env', e])] as const) {
    if (value.includes('\0')) {
      throw Object.assign(new TypeError(`The argument '${what}' must be a string without null bytes`), { code: 'ERR_INVALID_ARG_VALUE' });
    }
  }
}

export function requestFrame(
  id: number,
  file: string,
  args: readonly string[],
  options: SpawnOptions,
  modes: readonly [number, number, number],
  conns: number,
): Buffer {
  refuseNul(file, args, options);
  const env = Object.entries(options.env ?? process.env).flatMap(([k, v]) => (v === undefined ? [] : [`${k}=${v}`]));
  // argv[0] is the file as given, as Node passes it.
  const argv = [file, ...args];
  const body = Buffer.from([file, options.cwd ?? '', ...argv, ...env].map((s) => `${s}\0`).join(''));
  const head = Buffer.alloc(24);
  head.writeUInt32LE(20 + body.length, 0);
  head.writeUInt32LE(id, 4);
  head.writeUInt32LE((options.detached === true ? FLAG_SETSID : 0) | (options.socket !== undefined ? FLAG_HANDLE : 0), 8);
  head.writeUInt8(modes[0], 12);
  head.writeUInt8(modes[1], 13);
  head.writeUInt8(modes[2], 14);
  head.writeUInt8(conns, 15);
  head.writeUInt32LE(argv.length, 16);
  head.writeUInt32LE(env.length, 20);
  return Buffer.concat([head, body]);
}

function attachFrame(id: number, index: number): Buffer {
  const frame = Buffer.alloc(12);
  frame.writeUInt32LE(8, 0);
  frame.writeUInt32LE(id, 4);
  frame.writeUInt32LE((ATTACH_BIT | index) >>> 0, 8);
  return frame;
}

let shared: Promise<HelperSpawner | null> | undefined;

/** Processes started each way, and helpers started, since this agent started (its metrics). */
export interface SpawnerStats {
  readonly helper: number;
  readonly node: number;
  readonly helperStarts: number;
}

const stats = { helper: 0, node: 0, helperStarts: 0 };

export function spawnerStats(): SpawnerStats {
  return { ...stats };
}

/** The agent's helper, started on first use (and again after it died); null when there is none. */
async function helper(): Promise<HelperSpawner | null> {
  for (;;) {
    if (shared === undefined) {
      const path = helperPath();
      const helperWanted = path !== null && runtimeSwitch('CANTO_AGENT_SPAWN_HELPER');
      if (helperWanted) stats.helperStarts++;
      shared = helperWanted ? HelperSpawner.start(path) : Promise.resolve(null);
    }
    const asked = shared;
    const current = await asked;
    if (current === null || !current.dead) return current;
    // Dead: the first caller to see it starts the next one, the others wait for that.
    if (shared === asked) shared = undefined;
  }
}

/** The running helper's pid and socket (for tests and diagnostics); null when processes start with Node's spawn. */
export async function runningSpawner(): Promise<{ pid: number; address: string } | null> {
  const current = await helper();
  return current === null ? null : { pid: current.pid, address: current.address };
}

/**
 * Starts a process, as Node's `spawn` with these options would; resolves once it has a pid (or
 * has failed to start, reported as Node does: an `error` event, then `close`).
 */
export async function spawnProcess(file: string, args: readonly string[], options: SpawnOptions): Promise<SpawnedProcess> {
  refuseNul(file, args, options);
  const spawner = await helper();
  // A helper that dies while starting this process fails the start: it may have started it.
  if (spawner !== null) {
    stats.helper++;
    return spawner.spawn(file, args, options);
  }
  stats.node++;
  if (options.socket !== undefined) stopReading(options.socket);
  const child: SpawnedProcess = nodeSpawn(file, [...args], {
    stdio: options.socket === undefined ? [...options.stdio] : [options.stdio[0], options.socket, options.stdio[2]],
    env: options.env as NodeJS.ProcessEnv | undefined,
    cwd: options.cwd,
    detached: options.detached,
  });
  return child;
}

/** Bytes of a process's stderr that `runToEnd` keeps for an error message. */
const STDERR_KEEP = 4096;

/**
 * Runs a process to its end with no input and its stdout discarded: its exit code (null when a
 * signal, or `timeoutMs`, which sends SIGTERM, ended it) and the end of its stderr.
 */
export async function runToEnd(
  file: string,
  args: readonly string[],
  options: { readonly timeoutMs?: number; readonly detached?: boolean; readonly env?: SpawnOptions['env'] } = {},
): Promise<{ code: number | null; stderr: string }> {
  const child = await spawnProcess(file, args, { stdio: ['ignore', 'ignore', 'pipe'], detached: options.detached, env: options.env });
  let stderr = '';
  child.stderr!.on('data', (chunk: Buffer) => {
    stderr = (stderr + chunk.toString('utf8')).slice(-STDERR_KEEP);
  });
  return new Promise((resolve) => {
    const timer = options.timeoutMs === undefined ? undefined : setTimeout(() => child.kill('SIGTERM'), options.timeoutMs);
    child.once('error', (err: Error) => (stderr = err.message));
    child.once('close', (code: number | null) => {
      clearTimeout(timer);
      resolve({ code: code !== null && code >= 0 ? code : null, stderr: stderr.trim() });
    });
  });
}
