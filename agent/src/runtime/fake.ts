/**
 * An in-memory runtime driver for fast unit and link tests. It never replaces the real runtime in
 * the end-to-end suite; its job is to let the channel and handlers be tested without root, CRIU or
 * seconds per boot.
 *
 * It keeps the contract the real drivers keep, because tests of the layers above rely on it:
 * every method is idempotent (start on a running desktop succeeds, hibernate on a stopped one
 * succeeds, destroy of an unknown one succeeds), first-boot settings apply once per disk, and it
 * refuses work on desktops it does not hold (`not_found`) or that are not running (`not_running`)
 * instead of pretending. `events` records the begin and end of each call so tests can check that
 * commands for one desktop never interleave; `delayMs` makes those windows wide.
 *
 * Guest files are a flat map of absolute path → bytes, whose directories are implied by the paths
 * (enough for the link and the API's streaming; the sandbox driver's tests cover real files).
 * Detached processes finish at once with what `exec` would give.
 */
import { connect, type Socket } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import sharp from 'sharp';
import type { InputAction } from '../../../shared/src/computer-use.js';
import { AgentFailure } from '../../../shared/src/protocol.js';
import type { Tier } from '../../../shared/src/tiers.js';
import type {
  CursorPosition,
  DesktopStatus,
  DesktopUsage,
  DetachedSpec,
  DisplaySize,
  DirListing,
  ExecOutcome,
  ExecSpec,
  FileRead,
  FileReadSpec,
  FileStat,
  FileWriteSpec,
  FirstBootSpec,
  GuestConnection,
  HibernateOptions,
  ProcessStatus,
  RuntimeCapabilities,
  RuntimeDriver,
  Screenshot,
  ScreenshotSpec,
  StartSpec,
  TerminalSession,
  VncSession,
} from './driver.js';
import { FakeTransfer } from './fake-transfer.js';
import type { ImportRecord } from './transfer.js';
import { runFakeCommand, type FakeCommandResult } from './fake-commands.js';
import { clampRegion, scaledSize } from './screen-geometry.js';

export interface FakeDesktop {
  tier: Tier;
  running: boolean;
  hasSnapshot: boolean;
  /** The first-boot settings applied to this disk, once; null until then. */
  firstBoot: FirstBootSpec | null;
  /** How many times first boot was applied; anything above 1 is a bug. */
  firstBootRuns: number;
  coldBoots: number;
  restores: number;
  files: Map<string, Buffer>;
  processes: Map<string, ProcessStatus>;
  display: DisplaySize;
  cursor: CursorPosition;
  /**
   * The move that imported this copy, until it first starts here; kept with the desktop, as the
   * sandbox runtime keeps it in the desktop's directory, so it outlives an agent restart.
   */
  imported?: ImportRecord;
}

export interface FakeDriverOptions {
  /** Added to every lifecycle call, in ms. Default 0. */
  readonly delayMs?: number;
  /** Whether hibernate keeps memory. Default true. */
  readonly memorySnapshots?: boolean;
  /** Whether the computer-use commands work (501 through the API otherwise). Default true. */
  readonly computerUse?: boolean;
  /** Where imports of moved desktops stage (fake-transfer.ts). Default: a temporary directory. */
  readonly stagingDir?: string;
}

export class FakeDriver implements RuntimeDriver {
  readonly desktops = new Map<string, FakeDesktop>();
  /** Open connections to guest ports, by desktop. */
  private readonly guestPorts = new Map<string, Set<Socket>>();
  readonly transfer: FakeTransfer;
  /** `"<method>:begin <id>"` and `"<method>:end <id>"`, in order. */
  readonly events: string[] = [];
  closed = false;
  /** What `usage()` charges each running desktop; a test sets it to stand for a loaded host. */
  memoryBytesPerDesktop = 0;
  private readonly delayMs: number;
  private readonly memorySnapshots: boolean;
  private readonly computerUse: boolean;
  /** Aborts sleeps in progress on close, so a closed driver leaves no timers behind. */
  private readonly closing = new AbortController();

  constructor(options: FakeDriverOptions = {}) {
    this.delayMs = options.delayMs ?? 0;
    this.memorySnapshots = options.memorySnapshots ?? true;
    this.computerUse = options.computerUse ?? true;
    this.transfer = new FakeTransfer(this.desktops, options.stagingDir ?? null);
  }

  capabilities(): RuntimeCapabilities {
    return { runtime: 'fake', memorySnapshots: this.memorySnapshots, computerUse: this.computerUse };
  }

  prepare(desktopId: string, tier: Tier): Promise<void> {
    return this.step('prepare', desktopId, () => {
      if (this.desktops.has(desktopId)) return;
      this.desktops.set(desktopId, {
        tier, running: false, hasSnapshot: false, firstBoot: null, firstBootRuns: 0, coldBoots: 0, restores: 0,
        files: new Map(), processes: new Map(), display: { width: 1024, height: 768 }, cursor: { x: 0, y: 0 },
      });
    });
  }

  start(spec: StartSpec): Promise<{ restored: boolean }> {
    return this.step('start', spec.desktopId, () => {
      const desktop = this.require(spec.desktopId);
      if (desktop.running) return { restored: false };
      desktop.running = true;
      if (desktop.hasSnapshot) {
        desktop.hasSnapshot = false;
        desktop.restores++;
        return { restored: true };
      }
      desktop.coldBoots++;
      desktop.display = { width: 1024, height: 768 }; // a cold boot starts at the default size
      if (spec.firstBoot && desktop.firstBootRuns === 0) {
        desktop.firstBoot = spec.firstBoot;
        desktop.firstBootRuns++;
      }
      return { restored: false };
    });
  }

  hibernate(desktopId: string, _options?: HibernateOptions): Promise<{ snapshot: boolean }> {
    return this.step('hibernate', desktopId, () => {
      const desktop = this.require(desktopId);
      if (desktop.running) {
        desktop.running = false;
        desktop.hasSnapshot = this.memorySnapshots;
        this.closeGuestPorts(desktopId);
      }
      return { snapshot: desktop.hasSnapshot };
    });
  }

  fork(sourceId: string, forkIds: readonly string[]): Promise<{ snapshot: boolean }> {
    return this.step('fork', sourceId, () => {
      const source = this.require(sourceId);
      if (source.running) throw new AgentFailure('runtime_error', `${sourceId} is running; fork needs a stopped desktop`, false);
      for (const id of forkIds) {
        if (this.desktops.has(id)) continue;
        const copy: FakeDesktop = {
          ...source,
          files: new Map(source.files),
          processes: new Map(),
          coldBoots: 0,
          restores: 0,
          firstBootRuns: source.firstBootRuns,
        };
        // A fork is made here, not imported.
        delete copy.imported;
        this.desktops.set(id, copy);
      }
      return { snapshot: source.hasSnapshot };
    });
  }

  destroy(desktopId: string): Promise<void> {
    return this.step('destroy', desktopId, () => {
      this.desktops.delete(desktopId);
      this.closeGuestPorts(desktopId);
    });
  }

  /**
   * Understands `true`, `false`, `exit N`, `echo WORDS` and `sleep SECONDS`; anything else exits
   * 127 like a shell would for an unknown command.
   */
  async exec(desktopId: string, spec: ExecSpec): Promise<ExecOutcome> {
    const out = await this.run(desktopId, spec);
    const cap = (text: string) => Buffer.from(text).subarray(0, spec.maxOutputBytes).toString();
    return {
      exitCode: out.exitCode,
      stdout: cap(out.stdout),
      stderr: cap(out.stderr),
      stdoutTruncated: Buffer.byteLength(out.stdout) > spec.maxOutputBytes,
      stderrTruncated: Buffer.byteLength(out.stderr) > spec.maxOutputBytes,
    };
  }

  async spawnDetached(desktopId: string, spec: DetachedSpec): Promise<void> {
    const out = await this.run(desktopId, { command: spec.command, timeoutMs: 60_000 });
    this.running(desktopId).processes.set(spec.processId, {
      status: 'exited',
      exitCode: out.exitCode,
      stdoutTail: out.stdout,
      stderrTail: out.stderr,
    });
  }

  async processStatus(desktopId: string, processId: string, tailBytes: number): Promise<ProcessStatus | null> {
    const st = this.running(desktopId).processes.get(processId);
    if (st === undefined) return null;
    const tail = (text: string) => Buffer.from(text).subarray(-tailBytes).toString();
    return { ...st, stdoutTail: tail(st.stdoutTail), stderrTail: tail(st.stderrTail) };
  }

  async readFile(desktopId: string, spec: FileReadSpec): Promise<FileRead> {
    const bytes = this.running(desktopId).files.get(spec.path);
    if (bytes === undefined) throw new AgentFailure('path_missing', 'no such file', false);
    if (spec.offset === null && bytes.length > spec.maxWholeBytes) throw new AgentFailure('too_large', 'file is too large', false);
    const start = Math.min(spec.offset ?? 0, bytes.length);
    const window = spec.offset === null ? bytes : bytes.subarray(start, start + spec.length);
    return {
      size: bytes.length,
      length: window.length,
      eof: start + window.length >= bytes.length,
      body: (async function* () {
        if (window.length > 0) yield window;
      })(),
    };
  }

  async writeFile(desktopId: string, spec: FileWriteSpec, body: AsyncIterable<Buffer>): Promise<void> {
    const files = this.running(desktopId).files;
    const chunks: Buffer[] = [];
    for await (const chunk of body) chunks.push(chunk);
    const current = files.get(spec.path) ?? Buffer.alloc(0);
    if (spec.appendAt === null) {
      files.set(spec.path, Buffer.concat(chunks));
    } else if (current.length !== spec.appendAt) {
      throw new AgentFailure('path_conflict', 'file size does not match the append offset', false, current.length);
    } else {
      files.set(spec.path, Buffer.concat([current, ...chunks]));
    }
  }

  async deletePath(desktopId: string, path: string, _recursive: boolean): Promise<void> {
    if (!this.running(desktopId).files.delete(path)) throw new AgentFailure('path_missing', 'no such file', false);
  }

  async statPath(desktopId: string, path: string): Promise<FileStat> {
    const bytes = this.running(desktopId).files.get(path);
    if (bytes === undefined) throw new AgentFailure('path_missing', 'no such file', false);
    return { fileType: 'file', sizeBytes: bytes.length, modifiedAt: new Date(0).toISOString(), mode: '644' };
  }

  async listDir(desktopId: string, path: string, limit: number): Promise<DirListing> {
    const prefix = path.endsWith('/') ? path : `${path}/`;
    const names = [...this.running(desktopId).files.keys()]
      .filter((p) => p.startsWith(prefix) && !p.slice(prefix.length).includes('/'))
      .map((p) => p.slice(prefix.length))
      .sort();
    const entries = names.slice(0, limit).map((name) => ({
      name,
      fileType: 'file' as const,
      sizeBytes: this.running(desktopId).files.get(prefix + name)?.length ?? 0,
      modifiedAt: new Date(0).toISOString(),
    }));
    return { entries, truncated: names.length > limit };
  }

  private async run(desktopId: string, spec: Pick<ExecSpec, 'command' | 'timeoutMs'>): Promise<FakeCommandResult> {
    this.running(desktopId);
    return runFakeCommand(spec.command, spec.timeoutMs, (ms) => this.pause(ms));
  }

  async list(): Promise<DesktopStatus[]> {
    return [...this.desktops].map(([desktopId, d]) => ({ desktopId, running: d.running, hasSnapshot: d.hasSnapshot }));
  }

  async status(desktopId: string): Promise<DesktopStatus | null> {
    const d = this.desktops.get(desktopId);
    return d === undefined ? null : { desktopId, running: d.running, hasSnapshot: d.hasSnapshot };
  }

  /** Each running fake desktop counts `memoryBytesPerDesktop` (0 unless a test sets it). */
  async usage(): Promise<DesktopUsage> {
    const running = [...this.desktops.values()].filter((d) => d.running).length;
    return { running, memoryBytes: running * this.memoryBytesPerDesktop };
  }

  async close(): Promise<void> {
    this.closed = true;
    this.closing.abort();
    await this.transfer.close();
  }

  async getDisplay(desktopId: string): Promise<DisplaySize> {
    return { ...this.running(desktopId).display };
  }

  async setDisplay(desktopId: string, size: DisplaySize): Promise<DisplaySize> {
    const desktop = this.running(desktopId);
    desktop.display = { width: size.width, height: size.height };
    return { ...desktop.display };
  }

  /** A grey PNG of the display's size, cropped and scaled as the real driver does. */
  async screenshot(desktopId: string, spec: ScreenshotSpec): Promise<Screenshot> {
    const { display } = this.running(desktopId);
    const area = spec.region === null ? display : clampRegion(spec.region, display);
    const { width, height } = scaledSize(area, spec.scalePercent);
    const png = await sharp({ create: { width, height, channels: 3, background: { r: 128, g: 128, b: 128 } } }).png().toBuffer();
    if (png.length > spec.maxBytes) throw new AgentFailure('too_large', `the image is ${png.length} bytes`, false);
    return { png, width, height };
  }

  /** Follows the pointer through the batch; everything else is accepted and forgotten. */
  async input(desktopId: string, actions: readonly InputAction[]): Promise<CursorPosition> {
    const desktop = this.running(desktopId);
    const clamp = (x: number, y: number): CursorPosition => ({
      x: Math.min(x, desktop.display.width - 1),
      y: Math.min(y, desktop.display.height - 1),
    });
    for (const a of actions) {
      if (a.type === 'mouse_move') desktop.cursor = clamp(a.x, a.y);
      else if (a.type === 'click' && a.x !== undefined && a.y !== undefined) desktop.cursor = clamp(a.x, a.y);
      else if (a.type === 'drag') desktop.cursor = clamp(a.to.x, a.to.y);
    }
    return { ...desktop.cursor };
  }

  openVnc(desktopId: string): Promise<VncSession> {
    this.running(desktopId);
    return Promise.reject(new AgentFailure('unsupported', 'the fake runtime has no VNC server', false));
  }

  /** The fake has no guest to put a terminal in: terminals are a real runtime's (see the sandbox driver). */
  openTerminal(desktopId: string): Promise<TerminalSession> {
    this.running(desktopId);
    return Promise.reject(new AgentFailure('unsupported', 'the fake runtime has no terminals', false));
  }

  /**
   * The fake has no guest network: a running desktop's ports are the host's, so a test stands for
   * the guest app with a server on `127.0.0.1:<port>`. A refused connect rejects with the socket's
   * own error (`code` ECONNREFUSED), as the real drivers report it.
   */
  async openGuestPort(desktopId: string, port: number): Promise<GuestConnection> {
    this.running(desktopId);
    const socket = connect({ host: '127.0.0.1', port, allowHalfOpen: true, noDelay: true });
    await new Promise<void>((resolve, reject) => {
      socket.once('connect', resolve);
      socket.once('error', reject);
    });
    let open = this.guestPorts.get(desktopId);
    if (!open) this.guestPorts.set(desktopId, (open = new Set()));
    open.add(socket);
    socket.once('close', () => open.delete(socket));
    return socket;
  }

  /** As the real drivers do when a desktop stops: its port connections end with it. */
  private closeGuestPorts(desktopId: string): void {
    for (const socket of this.guestPorts.get(desktopId) ?? []) socket.destroy();
    this.guestPorts.delete(desktopId);
  }

  private running(desktopId: string): FakeDesktop {
    const desktop = this.require(desktopId);
    if (!desktop.running) throw new AgentFailure('not_running', `${desktopId} is not running`, false);
    return desktop;
  }

  private require(desktopId: string): FakeDesktop {
    const desktop = this.desktops.get(desktopId);
    if (!desktop) throw new AgentFailure('not_found', `no disk for ${desktopId} on this host`, false);
    return desktop;
  }

  private async step<T>(method: string, desktopId: string, body: () => T): Promise<T> {
    this.events.push(`${method}:begin ${desktopId}`);
    try {
      if (this.delayMs > 0) await this.pause(this.delayMs);
      return body();
    } finally {
      this.events.push(`${method}:end ${desktopId}`);
    }
  }

  private async pause(ms: number): Promise<void> {
    try {
      await sleep(ms, undefined, { signal: this.closing.signal });
    } catch {
      throw new AgentFailure('runtime_error', 'driver closed', true);
    }
  }
}
