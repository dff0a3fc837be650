/**
 * The operation engine: runs on the leader only. It claims pending operations (notified on
 * `canto_op_new`, with a poll behind it), re-drives operations a previous leader left running,
 * and drives each through its step. Work on one desktop is serialized in-process, so the
 * provisioner and an operation never place the same desktop twice.
 *
 * An engine runs in one leader term (engine/leader.ts): its settlements are fenced on that term
 * and its commands carry the term's epoch, so a deposed leader's engine can neither settle nor
 * make an agent act. When an agent says hello, every desktop recorded awake on its host is checked
 * (reconcile-awake.ts): a host that lost it must not leave it "awake but not running"; so is one
 * a replica's guest call found not running (`GUEST_GONE_CHANNEL`). What a
 * returning host must stop, it stops before it reports ready (fleet/hello-fence.ts).
 *
 * Retryable failures (the host is disconnected, a command timed out) are retried with capped
 * backoff until the operation is `operationDeadlineMs` old, and a want of room anywhere
 * (steps.NoCapacity) until it is `capacityWaitMs` old; anything else settles it `failed`.
 */
import type { Logger } from '../../../shared/src/log.js';
import { AgentFailure } from '../../../shared/src/protocol.js';
import { GUEST_GONE_CHANNEL, provisioningDesktops } from '../store/desktops.js';
import { desktopsOfHost } from '../store/hosts.js';
import { claimPending, OP_NEW_CHANNEL, runningOperations } from '../store/operations.js';
import type { OperationRow } from '../store/rows.js';
import * as steps from './steps.js';
import { move, type MoveParams } from './move.js';
import { failMove } from './move-failure.js';
import { fail } from './step-failure.js';
import { missingDisks, removeStaleCopy, staleCopies } from './stale-copies.js';
import type { HelloDesktops } from '../agents/gateway.js';
import type { LeaderTerm } from './leader.js';
import { PlacementReservations } from '../placement/reservations.js';
import { reconcileAwake } from './reconcile-awake.js';
import { PreparedDisks } from './prepared-disks.js';
import { passingDatabaseFault } from '../store/db-faults.js';

export interface EngineDeps extends Omit<steps.StepDeps, 'fence' | 'leading' | 'placements'> {
  pollMs: number;
  operationDeadlineMs: number;
  /** How long an operation waits for a host with room (steps.NoCapacity) before it fails. */
  capacityWaitMs: number;
  /** The term this replica leads in now; null when it does not lead. */
  currentTerm(): LeaderTerm | null;
  /** Told of every operation this engine settles (metrics). */
  onSettled?(op: OperationRow, outcome: 'succeeded' | 'failed'): void;
}

/** How long a stopping engine waits for its steps in flight. */
const STOP_GRACE_MS = 2_000;
/** How often an operation whose step found the lease's view lapsed looks whether its term leads again. */
const LEASE_RECHECK_MS = 100;
/** Tries of one check of a desktop recorded awake, and the wait after the first failure (doubling). */
const RECONCILE_TRIES = 6;
const RECONCILE_BACKOFF_MS = 500;
/** Desktops waiting for a host that a tick tries to place, of each tier. */
const PROVISION_PER_TIER = 20;

export class OperationEngine {
  private running = false;
  private timer: NodeJS.Timeout | null = null;
  private unlisten: (() => Promise<void>) | null = null;
  private unsubscribeHello: (() => void) | null = null;
  private readonly driving = new Set<string>();
  private readonly provisioning = new Set<string>();
  private readonly desktopChains = new Map<string, Promise<unknown>>();
  /** Desktops reported gone whose check is under way (guestGone). */
  private readonly checkingGone = new Set<string>();
  private readonly inFlight = new Set<Promise<unknown>>();
  private ticking = false;
  /** A kick came while a tick ran: its claim may have read the database before the new work. */
  private kickedWhileTicking = false;
  private kickPending: NodeJS.Immediate | null = null;
  private readonly stopWaiters = new Set<() => void>();
  private readonly log: Logger;
  private readonly placements = new PlacementReservations();
  private deps: EngineDeps & steps.StepDeps;

  constructor(private readonly base: EngineDeps) {
    this.log = base.logger.child({ component: 'engine' });
    this.deps = { ...base, placements: this.placements, fence: { holder: '', epoch: -1 }, leading: () => false };
  }

  async start(term: LeaderTerm): Promise<void> {
    if (this.running) return;
    this.running = true;
    this.deps = {
      ...this.base, placements: this.placements, prepared: new PreparedDisks(), fence: term, leading: () => this.running && this.base.currentTerm()?.epoch === term.epoch,
    };
    const sub = await this.deps.sql.listen(OP_NEW_CHANNEL, () => this.kick());
    const gone = await this.deps.sql.listen(GUEST_GONE_CHANNEL, (desktopId) => this.guestGone(desktopId));
    this.unlisten = async () => {
      await Promise.all([sub.unlisten(), gone.unlisten()]);
    };
    this.unsubscribeHello = this.deps.agents.onHello((hostId, desktops) => {
      this.track(this.reconcileHost(hostId));
      this.track(this.sweepStaleCopies(hostId, desktops));
      this.track(this.reportMissingDisks(hostId, desktops));
    });
    // Hosts that linked before this term began (a restart, a failover) said hello to nobody leading.
    for (const hostId of this.deps.agents.connectedHostIds()) {
      this.track(this.reconcileHost(hostId));
      this.track(this.sweepStaleCopies(hostId, this.deps.agents.helloDesktops(hostId)));
    }
    for (const op of await runningOperations(this.deps.sql)) this.launch(op);
    this.kick();
  }

  /**
   * After a step found the lease's view lapsed: true once this term leads again, false once the
   * engine stops (the term ended: its revoke stops the engine, and the next leader re-drives).
   */
  private async termGoesOn(): Promise<boolean> {
    for (;;) {
      if (!this.running) return false;
      if (this.deps.leading()) return true;
      await this.pause(LEASE_RECHECK_MS);
    }
  }

  /** Waits `ms`, or less if the engine stops meanwhile (a stop does not wait out a backoff). */
  private pause(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.stopWaiters.delete(done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.stopWaiters.add(done);
    });
  }

  private async reconcileHost(hostId: string): Promise<void> {
    for (const d of await desktopsOfHost(this.deps.sql, hostId)) {
      if (d.state !== 'awake') continue;
      this.track(this.checkAwake(() => reconcileAwake(this.deps, hostId, d.id), d.id));
    }
  }

  /**
   * One check of a desktop recorded awake (reconcile-awake.ts), in its queue, tried again after a
   * failure (a host that did not answer the inspect in time, a passing database fault): nothing
   * else asks again, and a desktop that died would stay awake and billed until its next guest call
   * or hello. The waits between tries are spent outside the queue, so its operations go on.
   */
  private async checkAwake(check: () => Promise<void>, desktopId: string): Promise<void> {
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.onDesktop(desktopId, check);
      } catch (err) {
        if (err instanceof steps.LeaseLost || attempt + 1 >= RECONCILE_TRIES || !this.running) throw err;
        this.log.warn({ err, desktopId, attempt }, 'checking whether a desktop recorded awake still runs failed; asking again');
      }
      // Jittered: after a hello, every awake desktop of the host is checked, and a host too busy
      // to answer them should not get them all back at the same moment.
      await this.pause(RECONCILE_BACKOFF_MS * 2 ** attempt * (0.5 + Math.random()));
      if (!this.running || !this.deps.leading()) return;
    }
  }

  /**
   * A replica's guest call found the desktop not running on its host (services/guest.ts): it is
   * checked as after a hello, its meter closing now (when its guest died is not known). One check
   * per desktop at a time; reports arriving meanwhile are that check's.
   */
  private guestGone(desktopId: string): void {
    if (!this.running || this.checkingGone.has(desktopId)) return;
    this.checkingGone.add(desktopId);
    const check = this.checkAwake(() => reconcileAwake(this.deps, null, desktopId, 'now'), desktopId);
    this.track(check.finally(() => this.checkingGone.delete(desktopId)));
  }

  /** Destroys the copies the host holds of desktops that are no longer its own (stale-copies.ts). */
  private async sweepStaleCopies(hostId: string, desktops: HelloDesktops): Promise<void> {
    for (const copy of await staleCopies(this.deps, hostId, desktops)) {
      this.track(this.onDesktop(copy.desktopId, () => removeStaleCopy(this.deps, hostId, copy.desktopId, copy.generation)));
    }
  }

  /** On a hello only: the list a term start has is as old as the host's link, and misses what came since. */
  private async reportMissingDisks(hostId: string, desktops: HelloDesktops): Promise<void> {
    const missing = await missingDisks(this.deps, hostId, desktops);
    if (missing.length > 0) {
      this.log.error({ hostId, desktopIds: missing.slice(0, 20), count: missing.length },
        "a host does not hold the disks of desktops recorded on it (its state directory lost or replaced?): their wakes fail with disk_missing until it is restored");
    }
  }

  /**
   * Stops claiming work and sending commands. Steps in flight get `graceMs` to finish; after that
   * they are left to fail their fenced commit, and the next leader re-drives their operations.
   */
  async stop(graceMs = STOP_GRACE_MS): Promise<void> {
    this.running = false;
    for (const wake of [...this.stopWaiters]) wake();
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    if (this.kickPending) clearImmediate(this.kickPending);
    this.kickPending = null;
    this.unsubscribeHello?.();
    this.unsubscribeHello = null;
    await this.unlisten?.().catch(() => {});
    this.unlisten = null;
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([
      Promise.allSettled([...this.inFlight]),
      new Promise<void>((resolve) => (timer = setTimeout(resolve, graceMs))),
    ]);
    clearTimeout(timer);
  }

  /**
   * New work was announced: a tick at the end of this turn of the event loop (notifications that
   * arrive together share it), or right after the one running, whose claim may have missed it.
   */
  private kick(): void {
    if (!this.running) return;
    if (this.ticking) {
      this.kickedWhileTicking = true;
      return;
    }
    if (this.kickPending !== null) return;
    this.kickPending = setImmediate(() => {
      this.kickPending = null;
      void this.tick();
    });
  }

  private async tick(): Promise<void> {
    if (!this.running || this.ticking) return;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    this.ticking = true;
    this.kickedWhileTicking = false;
    try {
      // A replica unsure it leads claims nothing (claimPending is fenced on the term as well).
      if (this.deps.leading()) for (const op of await claimPending(this.deps.sql, 20, this.deps.fence)) this.launch(op);
      const round: steps.PlacementRound = { noRoom: new Map() };
      for (const d of await provisioningDesktops(this.deps.sql, PROVISION_PER_TIER)) {
        if (this.provisioning.has(d.id)) continue;
        this.provisioning.add(d.id);
        const task = this.onDesktop(d.id, async () => {
          const fresh = await this.deps.sql`SELECT 1 FROM desktops WHERE id = ${d.id} AND state = 'provisioning' AND host_id IS NULL`;
          if (fresh.length === 1) await steps.provision(this.deps, d, round);
        }).catch((err: unknown) => {
          // No host with room yet is the normal wait; the next tick tries again.
          if (!(err instanceof AgentFailure && err.retryable) && !(err instanceof steps.NoCapacity)) this.log.warn({ err, desktopId: d.id }, 'provisioning failed');
        });
        this.track(task.finally(() => this.provisioning.delete(d.id)));
      }
    } catch (err) {
      this.log.error({ err }, 'engine tick failed');
    } finally {
      this.ticking = false;
      if (this.running) this.timer = setTimeout(() => void this.tick(), this.deps.pollMs);
      if (this.kickedWhileTicking) this.kick();
    }
  }

  private launch(op: OperationRow): void {
    if (this.driving.has(op.id)) return;
    this.driving.add(op.id);
    this.track(this.onDesktop(op.desktop_id, () => this.drive(op)).finally(() => this.driving.delete(op.id)));
  }

  private track(p: Promise<unknown>): void {
    const guarded = p.catch((err: unknown) => this.log.error({ err }, 'engine task failed'));
    this.inFlight.add(guarded);
    void guarded.finally(() => this.inFlight.delete(guarded));
  }

  private onDesktop<T>(desktopId: string, fn: () => Promise<T>): Promise<T> {
    const previous = this.desktopChains.get(desktopId) ?? Promise.resolve();
    const next = previous.catch(() => {}).then(fn);
    this.desktopChains.set(desktopId, next);
    void next.catch(() => {}).finally(() => {
      if (this.desktopChains.get(desktopId) === next) this.desktopChains.delete(desktopId);
    });
    return next;
  }

  private async drive(op: OperationRow): Promise<void> {
    const log = this.log.child({ operationId: op.id, kind: op.kind, desktopId: op.desktop_id });
    let backoffMs = 200;
    for (;;) {
      if (!this.running) return;
      try {
        await STEP[op.kind](this.deps, op);
        log.info('operation succeeded');
        this.base.onSettled?.(op, 'succeeded');
        return;
      } catch (err) {
        if (err instanceof steps.AlreadySettled) return log.info('the operation was settled already (an earlier commit went through unheard)');
        if (err instanceof steps.LeaseLost) {
          // This replica could not tell that it still leads (a renewal slower than the lease's
          // margin). If the same term renews, the operation is still this term's to finish: only
          // a new term re-drives running operations. Not at once: a host that answers
          // `stale_epoch` says a newer leader exists before this replica's renewal finds out.
          if (await this.termGoesOn()) {
            log.info('the lease renewed in the same term; the operation goes on');
            await this.pause(LEASE_RECHECK_MS);
            continue;
          }
          return log.warn('lease lost; the next leader re-drives');
        }
        const age = (this.deps.clock?.now() ?? Date.now()) - retriesCountFrom(op).getTime();
        const retryable = (err instanceof AgentFailure && err.retryable) || (err instanceof steps.NoCapacity && age < this.deps.capacityWaitMs) || passingDatabaseFault(err);
        if (retryable && age < this.deps.operationDeadlineMs) {
          log.warn({ err: (err as Error).message, backoffMs }, 'retryable failure; retrying');
          await this.pause(backoffMs);
          backoffMs = Math.min(backoffMs * 2, 5_000);
          continue;
        }
        const error = describe(err);
        log.warn({ error, err }, 'operation failed');
        return this.settleFailed(op, error, log);
      }
    }
  }

  /**
   * Records the failure. A settlement cut short by a passing fault, or by a lease that renews in
   * the same term, is tried again: left running, the operation would hold its desktop until the
   * next term re-drove it.
   */
  private async settleFailed(op: OperationRow, error: { code: string; message: string }, log: Logger): Promise<void> {
    for (let backoffMs = 200; this.running; backoffMs = Math.min(backoffMs * 2, 5_000)) {
      try {
        let outcome: 'failed' | 'succeeded' = 'failed';
        if (op.kind === 'move') await failMove(this.deps, op, error);
        else outcome = await fail(this.deps, op, error);
        this.base.onSettled?.(op, outcome);
        return;
      } catch (err) {
        if (err instanceof steps.AlreadySettled) return log.info('the operation was settled already (an earlier commit went through unheard)');
        if (err instanceof steps.LeaseLost) {
          if (!(await this.termGoesOn())) return log.warn('lease lost; the next leader re-drives');
        } else if (!passingDatabaseFault(err)) {
          // Given up, the operation would stay running, holding its desktop, until the next term.
          log.error({ err, backoffMs }, 'could not settle failed operation; trying again');
        }
        await this.pause(backoffMs);
      }
    }
  }
}

/**
 * When an operation's retries began: its start, or for a move past its commit, the commit
 * (engine/move.ts `committed_at`).
 */
function retriesCountFrom(op: OperationRow): Date {
  const committedAt = op.kind === 'move' ? (op.params as unknown as MoveParams | null)?.committed_at : undefined;
  return committedAt ? new Date(committedAt) : (op.started_at ?? op.created_at);
}

const STEP: Record<OperationRow['kind'], (deps: steps.StepDeps, op: OperationRow) => Promise<void>> = {
  wake: steps.wake,
  hibernate: steps.hibernate,
  destroy: steps.destroy,
  fork: steps.fork,
  move,
};

/**
 * The error an API client sees on a failed operation. Agent messages carry host details (paths,
 * tool output) that stay in the logs; the client gets a fixed sentence per code.
 */
const AGENT_ERRORS: Partial<Record<AgentFailure['code'], { code: string; message: string }>> = {
  disconnected: { code: 'host_unavailable', message: 'the desktop host is unreachable' },
  timeout: { code: 'timeout', message: 'the desktop host did not answer in time' },
  stale_generation: { code: 'stale_generation', message: 'the host refused a command from an older generation' },
  conflict: { code: 'conflict', message: 'the desktop was running on a host where the move needed it stopped' },
  unsupported: { code: 'unsupported', message: "the host's agent cannot do this; upgrade it" },
  // Only a move's import says it: the source refused the ticket its export granted.
  unauthorized: { code: 'transfer_refused', message: "the move's source host refused the copy's transfer ticket; the agents' logs say why" },
  not_found: { code: 'disk_missing', message: "the desktop's host does not hold its disk (lost with the host's state directory); an operator has to restore it" },
  // Only a move's stop says it (1.17).
  snapshot_failed: { code: 'memory_not_kept', message: "the desktop's memory snapshot failed, so it was not moved: it runs on at its source with its programs; the source agent's log says why" },
};

function describe(err: unknown): { code: string; message: string } {
  if (err instanceof steps.StepFailure || err instanceof steps.NoCapacity) return { code: err.code, message: err.message };
  if (err instanceof AgentFailure) return AGENT_ERRORS[err.code] ?? { code: 'runtime_error', message: 'the desktop runtime failed; the host agent log has the details' };
  return { code: 'internal', message: 'internal error' };
}
