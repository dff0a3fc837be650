/**
 * The sandbox driver's lifecycle half (docs/architecture.md): prepare, start, hibernate, destroy,
 * fork and list desktops, each a bubblewrap sandbox whose state lives on disk (sandbox-driver.ts
 * has the whole picture). Lifecycle calls on one desktop are serialized by a keyed mutex.
 *
 * Guest operations run concurrently with each other, outside the mutex. Hibernate and destroy
 * therefore fence the desktop first (new operations get `not_running`), give file operations a
 * short grace, and kill whatever is still in flight before CRIU dumps or the guest is killed;
 * hibernate also kills the detached processes, which docs/api.md §3.2 says do not survive it.
 * Sessions out of the guest (VNC, terminals, port forwarders) and warm servers (warm-pool.ts)
 * close right after that drain; a desktop that starts drops those of its previous init.
 */
import { mkdir, rename, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { AgentFailure } from '../../../../shared/src/protocol.js';
import type { Tier } from '../../../../shared/src/tiers.js';
import type { DesktopLifecycle, DesktopStatus, ExecOutcome, HibernateOptions, RuntimeCapabilities, StartSpec } from '../driver.js';
import { applyTier, drainAndRemove, removeIfEmpty } from './host/cgroups.js';
import { coldBoot, runningInit, type InitProcess } from './host/cold-boot.js';
import { desktopStatus, listDesktops } from './host/desktop-status.js';
import { initOnceUndumped, keepFinishedDump, orphanedRestore, restore, type CriuInfo } from './host/criu.js';
import { takeSnapshot } from './host/snapshot-take.js';
import { applyFirstBoot, renderEnvFile, WRITE_ENV_COMMAND } from './host/first-boot.js';
import { writeCloneEnv } from './host/golden.js';
import type { VncSessions } from './computer-use/guest-vnc.js';
import type { TerminalSessions } from './guest/guest-terminal.js';
import type { GuestPorts } from './ports/guest-ports.js';
import { guestExec, MAX_OUTPUT_BYTES } from './guest/guest-exec.js';
import { NESTED_MOUNTPOINTS } from './guest/guest-init.js';
import type { GuestOperations } from './guest/guest-ops.js';
import { anyDetachedRunner, killGuestDetached, spawnGuestProcess } from './guest/guest-processes.js';
import { FRAMEBUFFER_FILE } from './computer-use/screenshot.js';
import { isSameProcess, signal, waitFor } from './host/host-procs.js';
import type { KeyedMutex } from './host/keyed-mutex.js';
import { compactFile, worthCompacting } from './host/sparse.js';
import { createFork, freeze, mountDisk, standsOnLayers } from './host/layers.js';
import { collectUnusedLayers, discardOlderAside, discardTree } from './host/discarded.js';
import { requireRunningConfinement } from './host/confinement.js';
import { sealRunningGuest } from './host/running-seal.js';
import {
  desktopPaths, ensureDisk, ensureSkeleton, exists, hasDisk, TEMPLATE_CLONE_FILE, writeFileAtomic, type DesktopPaths,
} from './host/layout.js';
import type { RuntimeLog } from './runtime-log.js';

/** Grace for a desktop's processes to leave its cgroups after a dump or a kill. */
const DRAIN_MS = 3_000;
/** Timeout of the driver's own guest commands (first boot, responsiveness probe). */
const INTERNAL_EXEC_MS = 30_000;
/** How long hibernate lets in-flight file operations finish before killing them. */
const FILE_OP_GRACE_MS = 5_000;

/** What the lifecycle uses of the rest of the driver. */
export interface LifecycleParts {
  readonly stateDir: string;
  readonly criu: CriuInfo | null;
  readonly tools: { readonly bwrap: string; readonly nsenter: string };
  readonly mutex: KeyedMutex;
  readonly guest: GuestOperations;
  readonly vnc: VncSessions;
  readonly terminals: TerminalSessions;
  readonly ports: GuestPorts;
  readonly log: RuntimeLog;
}

export class SandboxLifecycle implements Omit<DesktopLifecycle, 'close' | 'usage'> {
  private readonly stateDir: string;
  private readonly criu: CriuInfo | null;
  private readonly tools: { readonly bwrap: string; readonly nsenter: string };
  private readonly mutex: KeyedMutex;
  private readonly guest: GuestOperations;
  private readonly vnc: VncSessions;
  private readonly terminals: TerminalSessions;
  private readonly ports: GuestPorts;
  private readonly log: RuntimeLog;
  /** Told when a snapshot could not be restored (the desktop then boots cold): host/golden.ts. */
  restoreFailed: ((desktopId: string) => Promise<void>) | null = null;
  /** Framebuffer compactions queued or under way, by desktop (`compactFramebufferNext`). */
  private readonly compactions = new Map<string, AbortController>();

  constructor(parts: LifecycleParts) {
    ({
      stateDir: this.stateDir, criu: this.criu, tools: this.tools, mutex: this.mutex, guest: this.guest,
      vnc: this.vnc, terminals: this.terminals, ports: this.ports, log: this.log,
    } = parts);
  }

  capabilities(): RuntimeCapabilities {
    return { runtime: 'sandbox', memorySnapshots: this.criu !== null, computerUse: true };
  }

  async prepare(desktopId: string, _tier: Tier): Promise<void> {
    const paths = desktopPaths(this.stateDir, desktopId);
    await this.mutex.run(desktopId, () => ensureDisk(paths));
  }

  async start(spec: StartSpec): Promise<{ restored: boolean }> {
    const paths = desktopPaths(this.stateDir, spec.desktopId);
    this.compactions.get(spec.desktopId)?.abort();
    return this.mutex.run(spec.desktopId, async () => {
      await ensureDisk(paths);
      // A forked desktop's disk is an overlay on shared layers (layers.ts); a host reboot unmounts it.
      await mountDisk(this.stateDir, paths);
      await ensureSkeleton(paths.rootfs, NESTED_MOUNTPOINTS);
      await mkdir(paths.empty, { recursive: true, mode: 0o555 });
      let restored = false;
      // A first boot hands the env file to the init, which writes it before Xvfb starts: the
      // same file an exec would write afterwards, without a cold guest process on the way.
      const firstBoot = spec.firstBoot !== null && !(await exists(paths.firstBootMarker)) ? spec.firstBoot : null;
      let envAtBoot = false;
      // A dump an agent killed before it left running would end this guest once it is adopted.
      let init = await initOnceUndumped(paths);
      const orphan = init === null ? await orphanedRestore(paths, spec.desktopId) : null;
      if (orphan !== null) {
        init = orphan;
        await writeFileAtomic(paths.initFile, JSON.stringify(init));
        this.log('a guest restored after its agent stopped is adopted', { desktopId: spec.desktopId });
        await sealRunningGuest(orphan.pid, this.tools.nsenter, spec.desktopId, this.log); // an older agent's restore left /proc writable
      }
      if (init === null) {
        const t0 = performance.now();
        this.terminals.booting(spec.desktopId);
        // Warm servers of a previous init are dead or about to be: a new init gets its own.
        await this.guest.reset(spec.desktopId);
        // So does the port forwarder, which would otherwise hold the old network namespace.
        await this.ports.closeAll(spec.desktopId);
        if (await keepFinishedDump(paths, () => this.discardSpent(spec.desktopId, paths))) this.log('a memory snapshot whose dump ended after its agent stopped is kept', { desktopId: spec.desktopId });
        await rm(paths.snapshotTmp, { recursive: true, force: true });
        // Leftovers of a desktop whose init died (or of a restore the agent crashed during) would
        // otherwise run beside the new guest: kill them, and start from fresh groups.
        await drainAndRemove(spec.desktopId, 0);
        await applyTier(spec.desktopId, spec.tier);
        if (await exists(paths.snapshot)) {
          envAtBoot = firstBoot !== null && (await writeCloneEnv(paths, firstBoot.env));
          init = await this.tryRestore(paths, spec.desktopId);
        }
        restored = init !== null;
        if (init === null) {
          await applyTier(spec.desktopId, spec.tier); // again: a failed restore removed the groups
          const envFile = firstBoot === null ? null : renderEnvFile(firstBoot.env);
          init = await coldBoot(paths, spec.desktopId, this.tools, envFile);
          envAtBoot = envFile !== null;
          await writeFileAtomic(paths.initFile, JSON.stringify(init));
        }
        // The images describe memory that no longer matches the disk once the guest has run.
        if (restored) await this.discardSpent(spec.desktopId, paths);
        await rm(join(paths.dir, TEMPLATE_CLONE_FILE), { force: true });
        this.log('desktop started', { desktopId: spec.desktopId, restored, ms: Math.round(performance.now() - t0) });
      } else if (await exists(paths.snapshot)) {
        // The guest runs, so these images are spent: an agent stopped between a restore and
        // their removal left them. Kept, the next hibernate could not put its own in their place,
        // and a wake after the guest died would rewind it to them.
        await this.discardSpent(spec.desktopId, paths);
      }
      if (firstBoot !== null) {
        await applyFirstBoot(
          {
            writeEnv: envAtBoot ? null : (content) => this.execIn(spec.desktopId, init, WRITE_ENV_COMMAND, INTERNAL_EXEC_MS, content),
            startSetup: (script) => spawnGuestProcess(this.guest.target(spec.desktopId, init), { processId: 'setup', command: script }),
            markerPath: paths.firstBootMarker,
            log: (msg, fields) => this.log(msg, { desktopId: spec.desktopId, ...fields }),
          },
          firstBoot,
        );
      }
      // Once the answer has gone out (a spawn holds the agent's event loop for a fork's time).
      if (spec.inUse === true) setImmediate((ready: InitProcess) => this.guest.prewarm(spec.desktopId, ready), init);
      return { restored: restored || orphan !== null };
    });
  }

  async hibernate(desktopId: string, options: HibernateOptions = {}): Promise<{ snapshot: boolean }> {
    const paths = desktopPaths(this.stateDir, desktopId);
    return this.fenced(desktopId, async () => {
      if (!(await hasDisk(paths))) {
        await this.guest.reset(desktopId);
        return { snapshot: false };
      }
      const init = await initOnceUndumped(paths);
      if (init === null) {
        await this.guest.reset(desktopId);
        await this.ports.closeAll(desktopId);
        if (await keepFinishedDump(paths, () => this.discardSpent(desktopId, paths))) this.log('a memory snapshot whose dump ended after its agent stopped is kept', { desktopId });
        return { snapshot: await exists(paths.snapshot) };
      }
      const t0 = performance.now();
      await this.guest.inFlight.drain(desktopId, FILE_OP_GRACE_MS);
      await this.closeSessions(desktopId);
      // A move keeps them in the snapshot (and, should the dump fail, leaves the desktop running);
      // a cold stop below ends them anyway.
      if (!(options.keepDetached === true && this.criu !== null)) await this.killDetached(desktopId, init);
      const discardSpent = () => this.discardSpent(desktopId, paths);
      if (this.criu !== null && (await takeSnapshot(this.criu, paths, init, { desktopId, requireSnapshot: options.requireSnapshot === true, log: this.log, discardSpent }))) {
        await rm(paths.initFile, { force: true });
        await drainAndRemove(desktopId, DRAIN_MS);
        this.compactFramebufferNext(desktopId, paths);
        this.log('desktop hibernated', { desktopId, snapshot: true, ms: Math.round(performance.now() - t0) });
        return { snapshot: true };
      }
      await this.stopProcesses(paths, desktopId, init);
      this.log('desktop hibernated', { desktopId, snapshot: false, ms: Math.round(performance.now() - t0) });
      return { snapshot: false };
    });
  }

  /** Removes memory snapshot images the guest has run past (behind the caller, in the background). */
  private discardSpent(desktopId: string, paths: DesktopPaths): Promise<void> {
    return discardTree(this.stateDir, paths.snapshot, (err) => this.log('could not remove a spent snapshot', { desktopId, error: String(err) }, 'warn'), `${desktopId}.snapshot`);
  }

  async destroy(desktopId: string): Promise<void> {
    const paths = desktopPaths(this.stateDir, desktopId);
    this.compactions.get(desktopId)?.abort();
    await this.fenced(desktopId, async () => {
      // No grace: whatever a file operation would finish is about to be deleted.
      await this.guest.inFlight.drain(desktopId, 0);
      await this.closeSessions(desktopId);
      const init = await runningInit(paths);
      if (init !== null) await this.stopProcesses(paths, desktopId, init);
      else await removeIfEmpty(desktopId);
      // Its overlay, then the layers it alone stood on, go behind the answer (host/discarded.ts).
      const layered = await standsOnLayers(paths);
      await discardTree(this.stateDir, paths.dir, (err) => this.log('could not remove a destroyed desktop\'s files', { desktopId, error: String(err) }, 'warn'));
      if (layered) void collectUnusedLayers(this.stateDir, this.log, { desktopId });
    });
  }

  /**
   * Forks a stopped desktop on this host (layers.ts): its writable layer is frozen into a shared
   * read-only one, and each fork gets an empty writable layer over it, hard links to the memory
   * snapshot and its own framebuffer file. Forks that exist already are kept.
   */
  async fork(sourceId: string, forkIds: readonly string[]): Promise<{ snapshot: boolean }> {
    const source = desktopPaths(this.stateDir, sourceId);
    const forks = forkIds.map((id) => desktopPaths(this.stateDir, id));
    if (forkIds.includes(sourceId)) throw new AgentFailure('bad_request', 'a desktop cannot be its own fork', false);
    return this.mutex.run(sourceId, async () => {
      if (!(await hasDisk(source))) throw new AgentFailure('not_found', `unknown desktop ${sourceId}`, false);
      if ((await runningInit(source)) !== null) {
        throw new AgentFailure('runtime_error', `desktop ${sourceId} is running; only a stopped desktop can be forked`, false);
      }
      const snapshot = await exists(source.snapshot);
      const missing: DesktopPaths[] = [];
      for (const f of forks) if (!(await hasDisk(f))) missing.push(f);
      if (missing.length === 0) return { snapshot };
      const t0 = performance.now();
      const chain = await freeze(this.stateDir, source);
      for (const f of missing) {
        const id = f.dir.slice(f.dir.lastIndexOf('/') + 1);
        await this.mutex.run(id, () => createFork(source, f, chain, ['first-boot-done', '.ready', 'display.json', TEMPLATE_CLONE_FILE]));
      }
      this.log('desktop forked', { desktopId: sourceId, forks: missing.length, snapshot, ms: Math.round(performance.now() - t0) });
      return { snapshot };
    });
  }

  list(): Promise<DesktopStatus[]> {
    return listDesktops(this.stateDir);
  }

  async status(desktopId: string): Promise<DesktopStatus | null> {
    return desktopStatus(this.stateDir, desktopId);
  }

  /* ---------------------------------------------------------------- internals */

  /**
   * Ends what leads into a running guest from the host, all at once (one after another: 10–20 ms
   * of a hibernate): VNC servers' pipes and terminals' ptys lead out of the guest (CRIU cannot dump
   * them); the port forwarder holds the guest's network namespace and connections into it (dumped
   * closed: criu.ts, --tcp-close); a warm server in the guest would break the dump. Throws the
   * first failure once all have ended.
   */
  private async closeSessions(desktopId: string): Promise<void> {
    const ended = await Promise.allSettled([
      this.vnc.closeAll(desktopId), this.terminals.closeAll(desktopId), this.ports.closeAll(desktopId), this.guest.reset(desktopId),
    ]);
    const failed = ended.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed !== undefined) throw failed.reason;
  }

  /** Runs a stop under the mutex with the desktop fenced: no guest operation starts meanwhile. */
  private async fenced<T>(desktopId: string, fn: () => Promise<T>): Promise<T> {
    const release = this.guest.inFlight.fence(desktopId);
    try {
      return await this.mutex.run(desktopId, fn);
    } finally {
      release();
    }
  }

  /**
   * Xvfb is gone with the dump: the framebuffer file's zeros become holes (host/sparse.ts) in the
   * desktop's next turn of the mutex, after the hibernate has answered, when most of the file is
   * allocated (a boot since). A fork or an export waits for it; a start or a destroy stops it.
   */
  private compactFramebufferNext(desktopId: string, paths: DesktopPaths): void {
    const stop = new AbortController();
    this.compactions.get(desktopId)?.abort();
    this.compactions.set(desktopId, stop);
    void this.mutex.run(desktopId, async () => {
      try {
        if (stop.signal.aborted || !(await hasDisk(paths)) || (await runningInit(paths)) !== null) return;
        const fb = join(paths.fb, FRAMEBUFFER_FILE);
        if (!(await worthCompacting(fb))) return;
        await compactFile(fb, stop.signal);
      } catch (err) {
        if (!stop.signal.aborted) this.log('the framebuffer file keeps its zeros', { desktopId, error: String(err) });
      } finally {
        if (this.compactions.get(desktopId) === stop) this.compactions.delete(desktopId);
      }
    });
  }

  /**
   * docs/api.md §3.2: detached processes do not survive hibernation. Killed before the snapshot (and before a
   * cold stop), they read as `lost` afterwards. A failure is logged and does not block the stop.
   */
  private async killDetached(desktopId: string, init: InitProcess): Promise<void> {
    try {
      // The call starts a helper cold (≈30 ms, a tenth of a hibernate): only when a runner lives.
      if (!(await anyDetachedRunner(desktopId))) return;
      const n = await killGuestDetached(this.guest.target(desktopId, init));
      if (n > 0) this.log('detached processes killed', { desktopId, count: n });
    } catch (err) {
      this.log('could not kill detached processes', { desktopId, error: String(err) }, 'warn');
    }
  }

  /** Restores the snapshot; on failure sets the images aside (for inspection) and returns null. */
  private async tryRestore(paths: DesktopPaths, desktopId: string): Promise<InitProcess | null> {
    const aside = `${paths.snapshot}.failed-${Date.now()}`;
    if (this.criu === null) {
      this.log('snapshot present but memory snapshots are off; booting cold', { desktopId }, 'warn');
      await rename(paths.snapshot, aside);
      await discardOlderAside(this.stateDir, paths.dir, aside, (err) => this.log('could not remove images set aside', { desktopId, error: String(err) }, 'warn'));
      await this.restoreFailed?.(desktopId);
      return null;
    }
    let init: InitProcess | null = null;
    try {
      const restored = await restore(this.criu, paths, desktopId, paths.rootfs);
      init = restored.init;
      // Recorded at once, so an agent restart from here on adopts this guest instead of
      // restoring a second copy.
      await writeFileAtomic(paths.initFile, JSON.stringify(init));
      // The root is read-only again, the hostname the desktop's own, and the desktop answered (X
      // took a client): the restore's action script did all three (agent/native/restore-action.c,
      // or agent/guest/criu-restore-action.sh where the process spawner is not built).
      if (!restored.answer.ok) throw new Error(`restored desktop does not answer: ${restored.answer.error}`);
      await requireRunningConfinement(init.pid); // as the record said, now that it runs
      // Recorded and answering: CRIU's pidfile now names no restore that nobody recorded.
      await rm(join(paths.run, 'restore.pid'), { force: true });
      return init;
    } catch (err) {
      this.log('restore failed; booting cold, images kept aside', { desktopId, aside, error: String(err) }, 'warn');
      if (init !== null) await this.stopProcesses(paths, desktopId, init);
      await rename(paths.snapshot, aside).catch(() => undefined);
      await discardOlderAside(this.stateDir, paths.dir, aside, (err) => this.log('could not remove images set aside', { desktopId, error: String(err) }, 'warn'));
      await this.restoreFailed?.(desktopId);
      return null;
    }
  }

  /** Kills the guest (SIGKILL to its init ends the whole pid namespace) and its cgroups. */
  private async stopProcesses(paths: DesktopPaths, desktopId: string, init: InitProcess): Promise<void> {
    signal(init.pid, 'SIGKILL');
    await waitFor(async () => !(await isSameProcess(init.pid, init.startTime)), DRAIN_MS);
    await rm(paths.initFile, { force: true });
    if (!(await drainAndRemove(desktopId, DRAIN_MS))) {
      this.log('cgroups could not be removed', { desktopId }, 'warn');
    }
  }

  /** The driver's own commands: they run under the mutex, so no stop can overlap them. */
  private execIn(
    desktopId: string,
    init: InitProcess,
    command: string,
    timeoutMs: number,
    stdin?: string,
    privileged = false,
  ): Promise<ExecOutcome> {
    return guestExec({
      desktopId,
      privileged,
      initPid: init.pid,
      nsenterPath: this.tools.nsenter,
      command,
      timeoutMs,
      maxOutputBytes: MAX_OUTPUT_BYTES,
      ...(stdin === undefined ? {} : { stdin }),
    });
  }
}

