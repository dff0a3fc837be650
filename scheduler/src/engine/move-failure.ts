/**
 * A move that failed, undone or recorded (engine/move.ts has the phases).
 *
 * Before the commit the desktop still belongs to the source: the target drops what it imported
 * and an awake desktop is started again there. After the commit it belongs to the target, and an
 * awake one whose start there could not succeed is recorded hibernated on the target (its disk
 * and memory are there), billed to the move's stop, with one `desktop.hibernated` (`reason: move`,
 * `cause: start_failed`); a wake starts it later. A start that went through although it answered
 * a failure (a timeout of a slow restore) is hibernated again first, best effort, so that record
 * is true: a guest left running under it would be unbilled until its host relinked.
 *
 * Agent commands come first; every write (the record, the moving mark, the settlement) is one
 * transaction fenced on the leader's term, so a leader deposed meanwhile writes nothing and the
 * next one re-drives the move from what the database holds.
 */
import { inTransaction, type Sql } from '../store/db.js';
import { getDesktopById, transition } from '../store/desktops.js';
import { operationParams } from '../store/operations.js';
import { closeMeter, recordEvent } from '../store/events.js';
import type { DesktopRow, OperationRow } from '../store/rows.js';
import { targetGeneration, type MoveParams } from './move.js';
import { command, LeaseLost, settleFenced, type StepDeps } from './steps.js';
import { stopIfStarted } from './step-failure.js';

export async function failMove(deps: StepDeps, op: OperationRow, error: { code: string; message: string }): Promise<void> {
  // Whether the move committed is the database's word, never this process's memory: a COMMIT
  // that went through unheard leaves memory a phase behind, and undoing a committed move would
  // drop the target's copy, the only one the record points at.
  op.params = (await operationParams(deps.sql, op.id)) ?? op.params;
  const p = op.params as unknown as MoveParams;
  deps.placements.release(op.desktop_id);
  const d = await getDesktopById(deps.sql, op.desktop_id);
  const committed = p.phase === 'committed' || p.phase === 'started' || (d !== null && d.host_id === p.target_host_id && d.host_id !== p.source_host_id);
  // The host the desktop is to be recorded hibernated on, if it is.
  let stoppedOn: string | null = null;
  if (d && !committed) stoppedOn = await rollBack(deps, op, d, p);
  if (d && p.phase === 'committed' && p.was_awake && d.state === 'awake' && d.host_id === p.target_host_id) {
    await stopIfStarted(deps, op, d, p.target_host_id, true);
    stoppedOn = p.target_host_id;
  }
  await inTransaction(deps.sql, async (tx) => {
    if (d && stoppedOn !== null) await recordStopped(tx, d, p, stoppedOn);
    if (!committed) await tx`UPDATE desktops SET moving_operation_id = NULL WHERE id = ${op.desktop_id} AND moving_operation_id = ${op.id}`;
    await settleFenced(tx, deps.fence, op.id, { error });
  });
}

/**
 * Undoes a move that failed before its commit, on the agents: the target forgets what it
 * imported, an awake desktop runs again on the source. Returns the source when that start failed
 * too (the desktop is then to be recorded hibernated there), else null.
 */
async function rollBack(deps: StepDeps, op: OperationRow, d: DesktopRow, p: MoveParams): Promise<string | null> {
  if (p.target_host_id && deps.agents.isConnected(p.target_host_id)) {
    await command(deps, p.target_host_id, 'desktop.import.abort', { desktop_id: d.id, generation: targetGeneration(d) }).catch((err: unknown) => {
      if (err instanceof LeaseLost) throw err;
      deps.logger.warn({ err, desktopId: d.id, hostId: p.target_host_id }, 'failed move: the target could not drop its copy');
    });
  }
  // A hibernate may have been sent without its phase recorded: start is idempotent either way.
  if (!p.was_awake || d.state !== 'awake') return null;
  try {
    await command(deps, p.source_host_id, 'desktop.start', { desktop_id: d.id, generation: d.generation, operation_id: op.id, tier: d.tier, first_boot: null });
    return null;
  } catch (err) {
    if (err instanceof LeaseLost) throw err;
    deps.logger.warn({ err, desktopId: d.id, hostId: p.source_host_id }, 'failed move: the desktop could not be started again on its source');
    return p.source_host_id;
  }
}

/**
 * The desktop stopped at the move's stop and never ran again: hibernated, billed until then. A
 * move that failed before its stop, its source gone silent meanwhile (the start there failed
 * too), bills until that host was last heard from, as host health would have: not until the
 * move's deadline ran out, minutes later.
 */
async function recordStopped(tx: Sql, d: DesktopRow, p: MoveParams, hostId: string): Promise<void> {
  const done = await transition(tx, d.id, ['awake'], 'hibernated', { expectGeneration: d.generation });
  if (!done) return;
  const [silent] = p.stopped_at ? [] : await tx<Array<{ last_seen_at: Date }>>`SELECT last_seen_at FROM hosts WHERE id = ${hostId} AND status = 'down'`;
  await closeMeter(tx, d.id, p.stopped_at ? new Date(p.stopped_at) : (silent?.last_seen_at ?? null));
  await recordEvent(tx, {
    orgId: d.org_id, desktopId: d.id, type: 'desktop.hibernated',
    data: { reason: 'move', cause: 'start_failed', host_id: hostId, memory_snapshot: p.memory_snapshot ?? false },
  });
}
