/**
 * Drains, on the leader: a draining host is cordoned, and its desktops are moved off
 * `drain_parallel` at a time (counting a move until its desktop is on the target, awake again if
 * it was: the removal of the source's copy then overlaps the next move), awake ones first, each an ordinary move operation the engine drives
 * (engine/move.ts). A pass runs at once when a drain is asked for (on any replica: DRAIN_CHANNEL),
 * when one of its moves lands (a place is free) and when one settles (the drain may be over or
 * stopped); the interval behind them catches what nothing tells of (a host back from down).
 * The drainer keeps no state of its own: every pass reads the drains, their open
 * moves and the desktops left from the database, so a new leader simply carries on.
 *
 * A drain ends `finished` when the host holds no desktop. It stops short, with `drain_error`, when
 * one of its moves fails (the desktop stays where it was, whole; or, failed only in its start on
 * the target, stays there hibernated): the operator reads why, fixes it and asks for the drain
 * again, which resumes with the desktops still there. A host that goes
 * down mid-drain pauses it: its desktops' disks are only there.
 */
import type { Logger } from '../../../shared/src/log.js';
import type { Sql } from '../store/db.js';
import { activeDrains, DRAIN_CHANNEL, drainCandidates, drainCounts, endDrain, insertMove, lastFailedMove } from '../store/moves.js';
import { LeaseLost } from '../store/leases.js';
import type { SettleFence } from '../store/operations.js';
import type { HostRow, OperationRow } from '../store/rows.js';
import type { MoveParams } from './move.js';

export interface DrainerDeps {
  sql: Sql;
  logger: Logger;
  intervalMs: number;
  /** Whether the leader's link to the host is up: moves off a host out of reach wait. */
  isConnected(hostId: string): boolean;
  /**
   * The term this replica leads in, or null (engine/leader.ts): a pass starts only in one, and
   * each of its writes is fenced on it, so a leader that stalls mid-pass and resumes after
   * another took over writes nothing (the other's drainer alone counts each drain's `parallel`).
   */
  term(): SettleFence | null;
}

export class Drainer {
  private timer: NodeJS.Timeout | null = null;
  private unlisten: (() => Promise<void>) | null = null;
  private passing = false;
  /** A kick came during a pass, which may have read the drains before what it tells of. */
  private again = false;
  private readonly log: Logger;

  constructor(private readonly deps: DrainerDeps) {
    this.log = deps.logger.child({ component: 'drainer' });
  }

  async start(): Promise<void> {
    if (this.timer) return;
    const timer = setInterval(() => void this.pass(), this.deps.intervalMs);
    this.timer = timer;
    const sub = await this.deps.sql.listen(DRAIN_CHANNEL, () => this.kick());
    // Stopped (or stopped and started again) while the listen was being set up.
    if (this.timer !== timer || this.unlisten !== null) return void sub.unlisten().catch(() => undefined);
    this.unlisten = () => sub.unlisten();
    // A drain asked for before the listen began told nobody.
    this.kick();
  }

  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    const unlisten = this.unlisten;
    this.unlisten = null;
    await unlisten?.().catch(() => undefined);
  }

  /**
   * A pass now rather than at the next tick: a drain was asked for, or a move of a drain landed on
   * its target (freeing its place) or settled. Nothing while this replica does not lead.
   */
  kick(): void {
    if (this.timer === null) return;
    if (this.passing) this.again = true;
    else void this.pass();
  }

  /** One look at every drain; exported for tests that step it by hand. */
  async pass(): Promise<void> {
    // A replica unsure it leads (a stall, an overdue renewal) must not move desktops beside the
    // leader that may have taken over: two drainers would pass each drain's `parallel`.
    const term = this.deps.term();
    if (this.passing || term === null) return;
    this.passing = true;
    try {
      for (const host of await activeDrains(this.deps.sql)) await this.advance(host, term);
    } catch (err) {
      if (err instanceof LeaseLost) this.log.info('drain pass stopped: another replica leads now');
      else this.log.error({ err }, 'drain pass failed');
    } finally {
      this.passing = false;
    }
    if (this.again) {
      this.again = false;
      await this.pass();
    }
  }

  private async advance(host: HostRow, term: SettleFence): Promise<void> {
    const counts = await drainCounts(this.deps.sql, host);
    if (counts.failed > 0) {
      const failed = await lastFailedMove(this.deps.sql, host);
      const why = failedMoveWords(failed);
      await endDrain(this.deps.sql, host.id, why, term);
      this.log.warn({ hostId: host.id, error: why }, 'drain stopped');
      return;
    }
    if (counts.remaining === 0 && counts.running === 0) {
      await endDrain(this.deps.sql, host.id, null, term);
      this.log.info({ hostId: host.id, moved: counts.moved }, 'drain finished: the host holds no desktop');
      return;
    }
    if (host.status !== 'ready' || !this.deps.isConnected(host.id)) return;
    // A move whose desktop is on the target only cleans up on the source: the next one starts beside it.
    const room = (host.drain_parallel ?? 1) - counts.copying;
    if (room <= 0) return;
    for (const d of await drainCandidates(this.deps.sql, host.id, room)) {
      const moved = await insertMove(this.deps.sql, d.id, { requestedHostId: null, reason: 'drain', drain: host.drain_requested_at!.toISOString() }, term);
      // Refused: a user's operation got there first; the next pass looks again.
      if ('op' in moved) this.log.info({ hostId: host.id, desktopId: d.id, operationId: moved.op.id }, 'drain: moving a desktop');
    }
  }
}

/** Whether the operation is one of a drain's moves. */
export function isDrainMove(op: OperationRow): boolean {
  return op.kind === 'move' && (op.params as { drain?: unknown } | null)?.drain !== undefined;
}

/** Why a drain stopped, for `drain_error`: which desktop, where it is now, and the move's error. */
function failedMoveWords(failed: OperationRow | null): string {
  const error = failed?.error?.message ?? 'the move failed';
  const p = failed?.params as unknown as MoveParams | undefined;
  if (p?.phase === 'committed' || p?.phase === 'started') {
    return `desktop ${failed!.desktop_id} moved to ${p.target_host_id ?? '?'} but could not be started there (recorded hibernated; a wake retries): ${error}`;
  }
  return `desktop ${failed?.desktop_id ?? '?'} could not be moved: ${error}`;
}
