/**
 * The guest half of the sandbox driver: exec, files and detached processes of running desktops.
 *
 * Each operation is admitted the same way: registered in flight, so a hibernate or destroy that
 * fences the desktop refuses it or waits for it and kills it (in-flight.ts); then checked against
 * the desktop's state (unknown → `not_found`, stopped → `not_running`); then run by a process that
 * entered the guest's namespaces and root (guest-exec.ts for commands, guest-call.ts for the
 * helper), so no guest path is ever resolved on the host. The registration ends when that process
 * has exited, which for a file read is after its body was consumed.
 *
 * Two things keep the fixed cost per operation low. The guest init of a running desktop is kept in
 * memory and only checked (same pid, same start time) instead of being read from disk each time;
 * and an operation is handed to a warm server already inside the guest when one is ready
 * (warm-pool.ts). Both belong to one guest init: `reset` forgets them when the desktop starts or
 * stops.
 */
import { AgentFailure } from '../../../../../shared/src/protocol.js';
import type {
  CursorPosition,
  DetachedSpec,
  DirListing,
  DisplaySize,
  ExecOutcome,
  ExecSpec,
  FileRead,
  FileReadSpec,
  FileStat,
  FileWriteSpec,
  GuestPath,
  ProcessStatus,
  Screenshot,
  ScreenshotSpec,
} from '../../driver.js';
import type { InitProcess } from '../host/cold-boot.js';
import type { GuestTarget } from './guest-call.js';
import { startWarmFileServer } from './guest-helper.js';
import { guestExec, startWarmExecServer } from './guest-exec.js';
import { assertGuestPath, deleteGuest, listGuest, readGuest, statGuest, writeGuest } from './guest-files.js';
import { assertProcessId, guestProcessStatus, spawnGuestProcess } from './guest-processes.js';
import { InFlight, type GuestOp, type GuestOpKind } from './in-flight.js';
import { isSameProcessSync } from '../host/host-procs.js';
import { desktopPaths, hasDisk, type DesktopPaths } from '../host/layout.js';
import { captureScreenshot, guestScreenSize } from '../computer-use/screenshot.js';
import { guestXInput } from '../computer-use/input-steps.js';
import { WarmPool } from '../host/warm-pool.js';
import { coldExecIsQuick } from './guest-entry.js';

interface Entered {
  readonly target: GuestTarget;
  readonly init: InitProcess;
}

export class GuestOperations {
  /** Operations in flight, and the fence hibernate and destroy raise against new ones. */
  readonly inFlight = new InFlight();
  private readonly warm: WarmPool;
  /** The running guest init per desktop, as last seen; checked against /proc before each use. */
  private readonly inits = new Map<string, InitProcess>();

  constructor(
    private readonly stateDir: string,
    private readonly nsenterPath: string,
    private readonly runningInit: (paths: DesktopPaths) => Promise<InitProcess | null>,
    log?: (msg: string, fields?: object) => void,
  ) {
    this.warm = new WarmPool({
      start: (kind, desktopId, init, socketDir, socketName) =>
        kind === 'file'
          ? startWarmFileServer(desktopId, init.pid, nsenterPath, socketDir, socketName)
          : startWarmExecServer(desktopId, init.pid, nsenterPath, socketDir, socketName),
      // The desktop's `run/`, which only the driver sees (never the guest).
      socketDir: (desktopId) => desktopPaths(stateDir, desktopId).run,
      fenced: (desktopId) => this.inFlight.fenced(desktopId),
      ...(log === undefined ? {} : { log }),
    });
  }

  /**
   * Forgets the desktop's guest init and kills its warm servers, which belong to that init: called
   * when the desktop starts, and (fenced, after the drain) before it is dumped or killed.
   */
  async reset(desktopId: string): Promise<void> {
    this.inits.delete(desktopId);
    await this.warm.retire(desktopId);
  }

  /** Starts the desktop's warm servers ahead of its calls (see host/warm-pool.ts). */
  prewarm(desktopId: string, init: InitProcess): void {
    this.warm.prewarm('file', desktopId, init);
    if (!coldExecIsQuick()) this.warm.prewarm('exec', desktopId, init);
  }

  /** Kills every warm server; the driver is closing. */
  close(): Promise<void> {
    return this.warm.close();
  }

  /** A target for the driver's own helper calls (no registration: they run under the mutex). */
  target(desktopId: string, init: InitProcess, op: GuestOp | null = null): GuestTarget {
    return { desktopId, initPid: init.pid, nsenterPath: this.nsenterPath, op };
  }

  async exec(desktopId: string, spec: ExecSpec): Promise<ExecOutcome> {
    const { target, init } = await this.enter(desktopId, 'exec');
    const op = target.op as GuestOp;
    try {
      return await guestExec({
        desktopId,
        initPid: target.initPid,
        nsenterPath: this.nsenterPath,
        command: spec.command,
        timeoutMs: spec.timeoutMs,
        maxOutputBytes: spec.maxOutputBytes,
        sourceEnv: true,
        // A cold command starts as fast as a warm exec server's child would take it where it
        // enters natively and joins cgroups quickly (guest-entry.ts): no server to keep in the
        // desktop, nor to start after each wake.
        ...(coldExecIsQuick() ? {} : { warm: async () => (await this.warm.connect('exec', desktopId, init))?.socket ?? null }),
        register: (kill) => {
          op.attach(kill);
          return () => op.end();
        },
        stopped: () => op.cancelled,
      });
    } finally {
      op.end();
    }
  }

  async spawnDetached(desktopId: string, spec: DetachedSpec): Promise<void> {
    assertProcessId(spec.processId);
    await this.helperOp(desktopId, (t) => spawnGuestProcess(t, spec));
  }

  async processStatus(desktopId: string, processId: string, tailBytes: number): Promise<ProcessStatus | null> {
    assertProcessId(processId);
    return this.helperOp(desktopId, (t) => guestProcessStatus(t, processId, tailBytes));
  }

  async readFile(desktopId: string, spec: FileReadSpec): Promise<FileRead> {
    assertGuestPath(spec.path);
    return this.helperOp(desktopId, (t) => readGuest(t, spec));
  }

  async writeFile(desktopId: string, spec: FileWriteSpec, body: AsyncIterable<Buffer>): Promise<void> {
    assertGuestPath(spec.path);
    await this.helperOp(desktopId, (t) => writeGuest(t, spec, body));
  }

  async deletePath(desktopId: string, path: GuestPath, recursive: boolean): Promise<void> {
    assertGuestPath(path);
    await this.helperOp(desktopId, (t) => deleteGuest(t, path, recursive));
  }

  async statPath(desktopId: string, path: GuestPath): Promise<FileStat> {
    assertGuestPath(path);
    return this.helperOp(desktopId, (t) => statGuest(t, path));
  }

  async listDir(desktopId: string, path: GuestPath, limit: number): Promise<DirListing> {
    assertGuestPath(path);
    return this.helperOp(desktopId, (t) => listGuest(t, path, limit));
  }

  /**
   * A PNG of the screen (screenshot.ts): the X server's current size from the guest helper, the
   * pixels from the framebuffer file on the host side. The registration covers the helper call,
   * like any helper op; the rest reads a host file through a descriptor opened meanwhile and
   * enters nothing, so a stop racing it can at worst yield the last frame.
   */
  screenshot(desktopId: string, spec: ScreenshotSpec): Promise<Screenshot> {
    const fbDir = desktopPaths(this.stateDir, desktopId).fb;
    return this.helperOp(desktopId, (t) => captureScreenshot(fbDir, spec, () => guestScreenSize(t)));
  }

  /** The X screen's current size, from the X server itself (the helper's `xsize`, ≈1 ms warm). */
  screenSize(desktopId: string): Promise<DisplaySize> {
    return this.helperOp(desktopId, (t) => guestScreenSize(t));
  }

  /** Input played by the guest helper (input-steps.ts): the cursor after it, or null to run it as a script. */
  xinput(desktopId: string, steps: readonly string[], timeoutMs: number): Promise<CursorPosition | null> {
    return this.helperOp(desktopId, (t) => guestXInput(t, steps, timeoutMs));
  }

  /** The running guest init of an awake desktop: `not_found` or `not_running` otherwise. */
  runningInitOf(desktopId: string): Promise<InitProcess> {
    return this.init(desktopId, desktopPaths(this.stateDir, desktopId));
  }

  /** Registers the operation (or refuses it while the desktop is stopping), then checks state. */
  private async enter(desktopId: string, kind: GuestOpKind): Promise<Entered> {
    const paths = desktopPaths(this.stateDir, desktopId);
    const op = this.inFlight.begin(desktopId, kind);
    try {
      const init = await this.init(desktopId, paths);
      const target: GuestTarget = {
        ...this.target(desktopId, init, op),
        warm: () => this.warm.connect('file', desktopId, init),
      };
      return { target, init };
    } catch (err) {
      op.end();
      throw err;
    }
  }

  /**
   * The desktop's running guest init. A remembered one is used while the same process (pid and
   * start time) is alive: a desktop that stopped in any way has another init or none, so a stale
   * entry cannot pass. Otherwise the state on disk decides, as it always has.
   */
  private async init(desktopId: string, paths: DesktopPaths): Promise<InitProcess> {
    const known = this.inits.get(desktopId);
    if (known !== undefined && isSameProcessSync(known.pid, known.startTime)) return known;
    this.inits.delete(desktopId);
    if (!(await hasDisk(paths))) throw new AgentFailure('not_found', `unknown desktop ${desktopId}`, false);
    const init = await this.runningInit(paths);
    if (init === null) throw new AgentFailure('not_running', `desktop ${desktopId} is not running`, false);
    this.inits.set(desktopId, init);
    return init;
  }

  /**
   * One guest helper call. Its registration ends when the helper exits; a failure also kills the
   * helper, in case it is still running (an unparsable reply, say).
   */
  private async helperOp<T>(desktopId: string, fn: (target: GuestTarget) => Promise<T>): Promise<T> {
    const { target } = await this.enter(desktopId, 'file');
    const op = target.op as GuestOp;
    try {
      return await fn(target);
    } catch (err) {
      await op.killProcess();
      op.end();
      throw err;
    }
  }
}
