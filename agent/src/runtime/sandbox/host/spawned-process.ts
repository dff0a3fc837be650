/**
 * A process as the agent's runtime holds it (spawner.ts starts it): the shape of Node's
 * `ChildProcess` that callers use, and the child a spawner helper started, which gives it that
 * shape from the helper's reports (its pid, its exit) and the connections that are its stdio.
 */
import { EventEmitter } from 'node:events';
import type { Socket } from 'node:net';
import { constants } from 'node:os';
import type { Readable, Writable } from 'node:stream';
import type { OnRead } from '../../slabs.js';

export type StdioMode = 'pipe' | 'ignore' | 'inherit';

export interface SpawnOptions {
  readonly stdio: readonly [StdioMode, StdioMode, StdioMode];
  /** The child's whole environment (default: the agent's). */
  readonly env?: Readonly<Record<string, string | undefined>>;
  readonly cwd?: string;
  /** A new session and process group, led by the child (Node's `detached`). */
  readonly detached?: boolean;
  /**
   * Reads a piped stdout into this buffer (a socket's `onread`, runtime/slabs.ts) instead of
   * emitting 'data'. Only a child the helper starts has such a stdout: its `stdoutOnread` says so.
   */
  readonly stdoutOnread?: OnRead;
  /**
   * The child's fd 1 is this connection instead (stdio[1] is then not used): the agent stops
   * reading it and hands it over; the caller closes its own copy once the child has started. The
   * descriptor stays non-blocking, as with a socket in the stdio of Node's spawn.
   */
  readonly socket?: Socket;
}

/**
 * What callers use of a child: Node's `ChildProcess` has the same shape. Piped stdout and stderr
 * must be read or destroyed: `close` comes only once both have ended.
 */
export interface SpawnedProcess extends EventEmitter {
  readonly pid?: number | undefined;
  readonly stdin: Writable | null;
  readonly stdout: Readable | null;
  readonly stderr: Readable | null;
  readonly exitCode: number | null;
  readonly signalCode: NodeJS.Signals | null;
  /** Whether stdout reads through the spawn's `stdoutOnread` (absent: it emits 'data'). */
  readonly stdoutOnread?: boolean;
  kill(signal?: NodeJS.Signals | number): boolean;
  unref(): void;
}

const ERRNO_NAMES = new Map<number, string>(Object.entries(constants.errno).map(([name, n]) => [n, name]));

/** A child started by the helper; its events and streams follow Node's `ChildProcess`. */
export class HelperChild extends EventEmitter implements SpawnedProcess {
  pid: number | undefined;
  exitCode: number | null = null;
  signalCode: NodeJS.Signals | null = null;
  exited = false;
  private openStreams = 0;
  private closed = false;
  private referenced = true;

  constructor(
    private readonly spawner: { release(): void },
    readonly stdin: Socket | null,
    readonly stdout: Socket | null,
    readonly stderr: Socket | null,
    readonly stdoutOnread = false,
  ) {
    super();
    for (const s of [stdout, stderr]) {
      if (s === null) continue;
      this.openStreams++;
      s.once('close', () => this.streamClosed());
    }
    // Nothing is read from the child's stdin; reading lets its end (the child exited) be seen.
    stdin?.on('data', () => undefined);
  }

  kill(sig: NodeJS.Signals | number = 'SIGTERM'): boolean {
    if (this.pid === undefined || this.exited) return false;
    try {
      process.kill(this.pid, sig);
      return true;
    } catch {
      return false;
    }
  }

  unref(): void {
    if (!this.referenced) return;
    this.referenced = false;
    if (!this.exited) this.spawner.release();
  }

  /** The helper reaped the child (or, after the helper died, it is gone). */
  exit(code: number | null, sig: NodeJS.Signals | null): void {
    if (this.exited) return;
    this.exited = true;
    this.exitCode = code;
    this.signalCode = sig;
    if (this.referenced) this.spawner.release();
    this.stdin?.destroy();
    // Output nobody listens to yet is kept, unlike Node's spawn, which drains it at the exit:
    // callers hand a stream on after an await (a unit's tar stream waits for its HTTP answer),
    // and a short process may have exited by then. So `close` waits for piped output to be read
    // or destroyed.
    this.emit('exit', code, sig);
    this.maybeClose();
  }

  /** Not started: Node's spawn reports this as `error`, then `close`. */
  failed(errno: number, file: string): void {
    const code = ERRNO_NAMES.get(errno) ?? 'EIO';
    const err = Object.assign(new Error(`spawn ${file} ${code}`), { errno: -errno, code, syscall: `spawn ${file}`, path: file });
    for (const s of [this.stdin, this.stdout, this.stderr]) s?.destroy();
    this.exited = true;
    this.exitCode = -errno;
    if (this.referenced) this.spawner.release();
    setImmediate(() => {
      this.emit('error', err);
      this.maybeClose();
    });
  }

  private streamClosed(): void {
    this.openStreams--;
    this.maybeClose();
  }

  private maybeClose(): void {
    if (this.closed || !this.exited || this.openStreams > 0) return;
    this.closed = true;
    this.emit('close', this.exitCode, this.signalCode);
  }
}

/**
 * Stops Node reading `socket`, which `pause` alone does not (a paused socket reads on until its
 * buffer is full): bytes that arrive once a child holds it must reach the child alone. Node has
 * no public call for it; `_handle.readStop` is what its own streams use, the same since Node 0.x.
 */
export function stopReading(socket: Socket): void {
  socket.pause();
  const handle = (socket as unknown as { _handle?: { reading?: boolean; readStop?: () => number } | null })._handle;
  if (typeof handle?.readStop !== 'function') return;
  handle.reading = false;
  handle.readStop();
}
