/**
 * The sandbox runtime driver: each desktop is a bubblewrap sandbox (pid, mount, ipc, uts and net
 * namespaces, pivoted root) whose writable layer is a directory on this host, limited by cgroups
 * and hibernated with CRIU when a usable CRIU 4.x is present (otherwise by a cold stop).
 *
 * The driver keeps no state in memory that matters: whether a desktop is running is read from
 * `run/init.json` (host pid and start time of the guest init) and checked against /proc; whether
 * it has a snapshot is whether `snapshot/` exists (CRIU writes to `snapshot.tmp/`, renamed only
 * after a complete dump). A new driver on the same state directory therefore adopts the desktops
 * a previous agent left running. Lifecycle calls on one desktop are serialized by a keyed mutex.
 *
 * The driver is the four capabilities of the runtime driver interface wired together:
 * lifecycle (sandbox-lifecycle.ts, with the fencing of guest operations around a stop), guest
 * operations (guest/guest-ops.ts), computer use (computer-use/) and port access (ports/). Each
 * method here forwards to the part that implements it.
 */
import type { Socket } from 'node:net';
import { mkdir, realpath } from 'node:fs/promises';
import { resolve } from 'node:path';
import { AgentFailure } from '../../../../shared/src/protocol.js';
import type { Tier } from '../../../../shared/src/tiers.js';
import type { InputAction } from '../../../../shared/src/computer-use.js';
import type {
  DesktopStatus,
  DesktopUsage,
  DetachedSpec,
  CursorPosition,
  DirListing,
  DisplaySize,
  ExecOutcome,
  ExecSpec,
  FileRead,
  FileReadSpec,
  FileStat,
  FileWriteSpec,
  GuestConnection,
  GuestPath,
  HandedOffLink,
  HibernateOptions,
  HibernateStats,
  ProcessStatus,
  RestoreStats,
  RuntimeCapabilities,
  RuntimeDriver,
  Screenshot,
  ScreenshotSpec,
  StartSpec,
  TemplateStats,
  TerminalSession,
  TerminalSpec,
  VncSession,
} from '../driver.js';
import { detectCriu, type CriuInfo } from './host/criu.js';
import { resolveTool } from './host/tools.js';
import { resizeOneAtATime } from './computer-use/guest-display.js';
import { runInput } from './computer-use/guest-input.js';
import { VncSessions } from './computer-use/guest-vnc.js';
import { TerminalSessions } from './guest/guest-terminal.js';
import { GuestPorts } from './ports/guest-ports.js';
import { GuestOperations } from './guest/guest-ops.js';
import { GoldenTemplates } from './host/golden.js';
import { KeyedMutex } from './host/keyed-mutex.js';
import { SandboxTransfer } from './host/sandbox-transfer.js';
import { desktopPaths, desktopsDir, syncFilesystem } from './host/layout.js';
import { cgroupV1Problem, desktopUsage } from './host/cgroups.js';
import { SandboxLifecycle } from './sandbox-lifecycle.js';
import { runningInit } from './host/cold-boot.js';
import { helperPath } from './host/spawner.js';
import { favorDynamicCgroups } from './host/cgroup-migrations.js';
import { collectUnusedLayers, discardsSettled, discardUnfinishedForks } from './host/discarded.js';
import { assertOneFilesystem } from './host/state-filesystem.js';
import { noteQuickMigrations } from './guest/guest-entry.js';
import { raiseSharedLimits } from './host/shared-limits.js';
import { acquireEtcView, releaseEtcView } from './host/etc-view.js';
import { refuseInheritedCapabilities } from './host/inherited-caps.js';
import { MASKED_HOST_FILES, maskedHostPaths } from './guest/guest-init.js';
import { sealRunningGuests } from './host/running-seal.js';
import type { RuntimeLog } from './runtime-log.js';
import { runtimeSwitch } from '../../env-switch.js';

export interface SandboxDriverOptions {
  /** Directory holding every desktop's disk, snapshot and runtime files. */
  readonly stateDir: string;
  /** CRIU binary; default: `criu` on PATH, then /usr/local/sbin/criu, /usr/sbin/criu. */
  readonly criuPath?: string;
  /** false forces cold stops even when CRIU works. Default true. */
  readonly memorySnapshots?: boolean;
  /**
   * New desktops are clones of a golden template (host/golden.ts) and their first wake is a
   * restore, where CRIU works. Default false here; the agent turns it on (CANTO_AGENT_GOLDEN_TEMPLATES).
   */
  readonly goldenTemplates?: boolean;
  readonly log?: RuntimeLog;
}

export class SandboxDriver implements RuntimeDriver {
  private readonly mutex = new KeyedMutex();
  /** Moving stopped desktops to other hosts (sandbox-transfer.ts). */
  readonly transfer: SandboxTransfer;
  private readonly guest: GuestOperations;
  private readonly vnc: VncSessions;
  private readonly terminals: TerminalSessions;
  private readonly ports: GuestPorts;
  private readonly lifecycle: SandboxLifecycle;
  private golden: GoldenTemplates | null = null;
  private readonly restoreCounts = { restored: 0, failed: 0 };
  private readonly hibernateCounts = { memory: 0, cold: 0, refused: 0 };
  private readonly log: RuntimeLog;
  /** The guests' `/etc` (host/etc-view.ts), or null where they get the host's. */
  private etcView: string | null = null;

  private constructor(
    private readonly stateDir: string,
    criu: CriuInfo | null,
    tools: { readonly bwrap: string; readonly nsenter: string },
    log: RuntimeLog | undefined,
  ) {
    this.log = log ?? (() => undefined);
    this.transfer = new SandboxTransfer(stateDir, this.mutex, syncFilesystem, tools.bwrap);
    this.guest = new GuestOperations(stateDir, tools.nsenter, runningInit, this.log);
    const fenced = (desktopId: string) => this.guest.inFlight.fenced(desktopId);
    this.vnc = new VncSessions({
      nsenterPath: tools.nsenter,
      init: (desktopId) => this.guest.runningInitOf(desktopId),
      fenced,
      log: this.log,
    });
    this.terminals = new TerminalSessions({
      nsenterPath: tools.nsenter,
      init: (desktopId) => this.guest.runningInitOf(desktopId),
      fenced,
      log: this.log,
    });
    this.ports = new GuestPorts({
      nsenterPath: tools.nsenter,
      init: (desktopId) => this.guest.runningInitOf(desktopId),
      fenced,
      socketDir: (desktopId) => desktopPaths(stateDir, desktopId).run,
      log: this.log,
      // Relays are the spawner's children: without it, each would cost the agent a fork.
      relayProgram: runtimeSwitch('CANTO_AGENT_SPAWN_HELPER') ? helperPath() : null,
    });
    const { mutex, guest, vnc, terminals, ports } = this;
    this.lifecycle = new SandboxLifecycle({ stateDir, criu, tools, mutex, guest, vnc, terminals, ports, log: this.log });
  }

  /** Detects CRIU and the sandbox tools, and prepares the state directory. */
  static async create(options: SandboxDriverOptions): Promise<SandboxDriver> {
    // Its real path: overlays are found mounted by their path in the kernel's mount table, which
    // names no symlink. Under a symlinked state directory (a data disk linked into place) no
    // overlay was ever found mounted: one more stacked at every wake, and forks and destroys
    // moved a layer that was still mounted.
    await mkdir(resolve(options.stateDir), { recursive: true });
    const stateDir = await realpath(resolve(options.stateDir));
    const [bwrap, nsenter] = await Promise.all([
      resolveTool('bwrap', '/usr/bin/bwrap'),
      resolveTool('nsenter', '/usr/bin/nsenter'),
    ]);
    await refuseInheritedCapabilities();
    const cgroups = await cgroupV1Problem();
    if (cgroups !== null) throw new Error(cgroups);
    await assertOneFilesystem(stateDir);
    const criu = options.memorySnapshots === false ? null : await detectCriu(options.criuPath, options.log);
    const driver = new SandboxDriver(stateDir, criu, { bwrap, nsenter }, options.log);
    const migrations = await favorDynamicCgroups(runtimeSwitch('CANTO_AGENT_CGROUP_FAVOR_DYNMODS'), driver.log);
    noteQuickMigrations(migrations === 'already' || migrations === 'set');
    await raiseSharedLimits(runtimeSwitch('CANTO_AGENT_RAISE_SHARED_LIMITS'), driver.log);
    // Before any guest starts: every guest's /etc is this view (host/etc-view.ts).
    // The named secrets whether or not they exist yet: `passwd` makes `shadow-` later.
    driver.etcView = await acquireEtcView(stateDir, [...MASKED_HOST_FILES, ...maskedHostPaths().files], driver.log);
    await sealRunningGuests(stateDir, nsenter, driver.log);
    // Before anything forks (a template clone included).
    const unfinished = await discardUnfinishedForks(stateDir, (err) => driver.log('could not remove an unfinished fork', { error: String(err) }, 'warn'));
    if (unfinished > 0) driver.log('forks an earlier agent left unfinished were discarded', { count: unfinished });
    if (options.goldenTemplates === true && criu !== null) {
      const golden = await GoldenTemplates.open(stateDir, criu, driver.lifecycle, driver.log);
      driver.golden = golden;
    }
    // What an earlier agent's destroys left to remove (host/discarded.ts), behind everything else:
    // the directories, then the layers none stands on (that agent may have stopped before that).
    void collectUnusedLayers(stateDir, driver.log);
    driver.lifecycle.restoreFailed = async (desktopId) => {
      driver.restoreCounts.failed++;
      await driver.golden?.cloneFailed(desktopId);
    };
    driver.log('sandbox driver ready', { stateDir, criu: criu?.path ?? null, criuVersion: criu?.version ?? null, goldenTemplates: driver.golden !== null, cgroupMigrations: migrations });
    return driver;
  }

  capabilities(): RuntimeCapabilities {
    return this.lifecycle.capabilities();
  }

  templates(): TemplateStats | null {
    return this.golden?.stats() ?? null;
  }

  /** Whether a golden template is ready for new desktops, once any being built is done. */
  async templateReady(): Promise<boolean> {
    return (await this.golden?.whenReady()) != null;
  }

  prepare(desktopId: string, tier: Tier): Promise<void> {
    return this.golden === null ? this.lifecycle.prepare(desktopId, tier) : this.golden.prepare(desktopId, tier);
  }

  async start(spec: StartSpec): Promise<{ restored: boolean }> {
    const started = await this.lifecycle.start(spec);
    if (started.restored) this.restoreCounts.restored++;
    return started;
  }

  restores(): RestoreStats {
    return { ...this.restoreCounts };
  }

  async hibernate(desktopId: string, options: HibernateOptions = {}): Promise<{ snapshot: boolean }> {
    try {
      const stopped = await this.lifecycle.hibernate(desktopId, options);
      this.hibernateCounts[stopped.snapshot ? 'memory' : 'cold']++;
      return stopped;
    } catch (err) {
      if (err instanceof AgentFailure && err.code === 'snapshot_failed') this.hibernateCounts.refused++;
      throw err;
    }
  }

  hibernates(): HibernateStats {
    return { ...this.hibernateCounts };
  }

  destroy(desktopId: string): Promise<void> {
    return this.lifecycle.destroy(desktopId);
  }

  fork(sourceId: string, forkIds: readonly string[]): Promise<{ snapshot: boolean }> {
    return this.lifecycle.fork(sourceId, forkIds);
  }

  getDisplay(desktopId: string): Promise<DisplaySize> {
    return this.guest.screenSize(desktopId);
  }

  setDisplay(desktopId: string, size: DisplaySize): Promise<DisplaySize> {
    return resizeOneAtATime((spec) => this.guest.exec(desktopId, spec), size, desktopId);
  }

  screenshot(desktopId: string, spec: ScreenshotSpec): Promise<Screenshot> {
    return this.guest.screenshot(desktopId, spec);
  }

  input(desktopId: string, actions: readonly InputAction[]): Promise<CursorPosition> {
    return runInput((spec) => this.guest.exec(desktopId, spec), actions, (steps, ms) => this.guest.xinput(desktopId, steps, ms));
  }

  openVnc(desktopId: string, viewOnly: boolean): Promise<VncSession> {
    return this.vnc.open(desktopId, viewOnly);
  }

  openTerminal(desktopId: string, spec: TerminalSpec): Promise<TerminalSession> {
    return this.terminals.open(desktopId, spec);
  }

  openGuestPort(desktopId: string, port: number): Promise<GuestConnection> {
    return this.ports.open(desktopId, port);
  }

  handOffGuestPort(desktopId: string, port: number, client: Socket): Promise<HandedOffLink | null> {
    return this.ports.handOff(desktopId, port, client);
  }

  exec(desktopId: string, spec: ExecSpec): Promise<ExecOutcome> {
    return this.guest.exec(desktopId, spec);
  }

  spawnDetached(desktopId: string, spec: DetachedSpec): Promise<void> {
    return this.guest.spawnDetached(desktopId, spec);
  }

  processStatus(desktopId: string, processId: string, tailBytes: number): Promise<ProcessStatus | null> {
    return this.guest.processStatus(desktopId, processId, tailBytes);
  }

  readFile(desktopId: string, spec: FileReadSpec): Promise<FileRead> {
    return this.guest.readFile(desktopId, spec);
  }

  writeFile(desktopId: string, spec: FileWriteSpec, body: AsyncIterable<Buffer>): Promise<void> {
    return this.guest.writeFile(desktopId, spec, body);
  }

  deletePath(desktopId: string, path: GuestPath, recursive: boolean): Promise<void> {
    return this.guest.deletePath(desktopId, path, recursive);
  }

  statPath(desktopId: string, path: GuestPath): Promise<FileStat> {
    return this.guest.statPath(desktopId, path);
  }

  listDir(desktopId: string, path: GuestPath, limit: number): Promise<DirListing> {
    return this.guest.listDir(desktopId, path, limit);
  }

  list(): Promise<DesktopStatus[]> {
    return this.lifecycle.list();
  }

  status(desktopId: string): Promise<DesktopStatus | null> {
    return this.lifecycle.status(desktopId);
  }

  usage(): Promise<DesktopUsage> {
    return desktopUsage(desktopsDir(this.stateDir));
  }

  async close(): Promise<void> {
    // A template being built is hibernated first: none is left running, hidden from list().
    await this.golden?.close();
    // VNC sessions are the agent's: their clients are gone with it.
    await this.vnc.close();
    await this.terminals.close();
    await this.ports.close();
    await this.guest.close();
    await this.mutex.idle();
    // Destroyed desktops still being removed (host/discarded.ts): their overlays are unmounted,
    // their files and unused layers gone once this resolves, so a caller may remove the state
    // directory.
    await discardsSettled(this.stateDir).catch((err: unknown) => this.log('could not remove destroyed desktops\' files or unused layers', { error: String(err) }, 'warn'));
    // Running guests keep their binds of it; the next agent mounts it again.
    if (this.etcView !== null) {
      this.etcView = null;
      await releaseEtcView(this.stateDir);
    }
  }
}
