/**
 * An operation that failed (engine.ts gave up on it): what its host did is found out first, then
 * the record is made to say so, in one transaction fenced on the term with the settlement.
 *
 * The failure an engine gives up on is the last attempt's, and a command sent by an earlier one
 * may have done its work anyway (it timed out and ran on, or it finished and the commit after it
 * failed). So a failure is never taken as "nothing happened" where the host can be asked:
 * - a wake: the desktop is hibernated on its host again (best effort, a no-op where nothing runs),
 *   then recorded where it was (`hibernated`, or `provisioning` if never placed). Left running
 *   under that record, it would be unbilled until its host next said hello;
 * - a hibernate: the host is asked whether the desktop still runs (queued behind the hibernate on
 *   the agent). Stopped, it is recorded hibernated with the hibernate's own commit (meter closed,
 *   event, settled as succeeded: it is what the client asked for); running, or the host out of
 *   reach, it is recorded awake again (a failed dump leaves the guest running);
 * - a destroy: it is sent again (destroy is idempotent). Answered, the desktop is recorded
 *   destroyed with the destroy's own commit; otherwise nothing changes, and the copy a host holds
 *   of a desktop recorded destroyed later is swept at its next hello (stale-copies.ts);
 * - a fork: the copies it may have left on the source's host are removed, best effort.
 * (A failed move is engine/move-failure.ts's.)
 */
import { inTransaction } from '../store/db.js';
import { getDesktopById, transition } from '../store/desktops.js';
import type { DesktopRow, OperationRow } from '../store/rows.js';
import {
  command, FORK_GENERATION, inspect, LeaseLost, recordDestroyed, recordHibernated, settleFenced, unlinkedAndLost, type ForkParams, type StepDeps,
} from './steps.js';

/** Records the failure; answers how the operation settled (`succeeded` where the host did the work after all). */
export async function fail(deps: StepDeps, op: OperationRow, error: { code: string; message: string }): Promise<'failed' | 'succeeded'> {
  const before = await getDesktopById(deps.sql, op.desktop_id);
  const hostId = before?.host_id ?? null;
  let stoppedSnapshot: boolean | null = null;
  let destroyedThere = false;
  if (before && hostId !== null) {
    if (op.kind === 'wake' && before.state === 'waking') await stopIfStarted(deps, op, before, hostId, false);
    if (op.kind === 'hibernate' && before.state === 'hibernating') stoppedSnapshot = await stoppedOn(deps, before, hostId);
    if (op.kind === 'destroy' && ['provisioning', 'awake', 'hibernated'].includes(before.state)) destroyedThere = await destroyedOn(deps, op, before, hostId);
  }
  const outcome = await inTransaction(deps.sql, async (tx): Promise<'failed' | 'succeeded'> => {
    const d = (await getDesktopById(tx, op.desktop_id))!;
    // What the host was found to have done is recorded as the operation's success.
    if (op.kind === 'hibernate' && d.state === 'hibernating' && stoppedSnapshot !== null && d.generation === before!.generation) {
      await recordHibernated(tx, deps, op, d, stoppedSnapshot);
      return 'succeeded';
    }
    if (op.kind === 'destroy' && destroyedThere && d.generation === before!.generation) {
      await recordDestroyed(tx, deps, op, d, null);
      return 'succeeded';
    }
    if (op.kind === 'wake' && d.state === 'waking') await transition(tx, d.id, ['waking'], d.host_id ? 'hibernated' : 'provisioning');
    if (op.kind === 'hibernate' && d.state === 'hibernating') await transition(tx, d.id, ['hibernating'], 'awake');
    await settleFenced(tx, deps.fence, op.id, { error });
    return 'failed';
  });
  if (op.kind === 'fork') await removeForkLeftovers(deps, op);
  return outcome;
}

/**
 * Hibernates a desktop whose start on `hostId` may have gone through although it answered a
 * failure (a timeout of a slow restore), before it is recorded hibernated: left running, it would
 * be unbilled until its host next said hello (fleet/hello-fence.ts stops it then). Best effort.
 * `keepDetached`: a moved desktop's detached processes are part of it; a failed wake's are not
 * (a user's hibernate ends them, and so does this stop).
 */
export async function stopIfStarted(deps: StepDeps, op: OperationRow, d: DesktopRow, hostId: string, keepDetached: boolean): Promise<void> {
  if (!deps.agents.isConnected(hostId)) return;
  try {
    await command(deps, hostId, 'desktop.hibernate', { desktop_id: d.id, generation: d.generation, operation_id: op.id, ...(keepDetached ? { keep_detached: true } : {}) });
  } catch (err) {
    if (err instanceof LeaseLost) throw err;
    deps.logger.warn({ err, desktopId: d.id, hostId }, 'a failed start: could not make sure the desktop is stopped');
  }
}

/** Whether the host has stopped the desktop after all: its snapshot flag if so, null if it runs or cannot say. */
async function stoppedOn(deps: StepDeps, d: DesktopRow, hostId: string): Promise<boolean | null> {
  if (!deps.agents.isConnected(hostId)) return null;
  try {
    const held = await inspect(deps, hostId, d.id);
    return held !== null && !held.running ? held.has_snapshot : null;
  } catch (err) {
    if (err instanceof LeaseLost) throw err;
    deps.logger.warn({ err, desktopId: d.id, hostId }, 'a failed hibernate: could not ask the host whether the desktop still runs');
    return null;
  }
}

/** Sends the destroy again; whether the host answered it (its disk is gone). */
async function destroyedOn(deps: StepDeps, op: OperationRow, d: DesktopRow, hostId: string): Promise<boolean> {
  if (!deps.agents.isConnected(hostId) || (await unlinkedAndLost(deps, hostId)) !== null) return false;
  try {
    await command(deps, hostId, 'desktop.destroy', { desktop_id: d.id, generation: d.generation, operation_id: op.id });
    return true;
  } catch (err) {
    if (err instanceof LeaseLost) throw err;
    deps.logger.warn({ err, desktopId: d.id, hostId }, 'a failed destroy: the host did not destroy it on a second try either');
    return false;
  }
}

async function removeForkLeftovers(deps: StepDeps, op: OperationRow): Promise<void> {
  const source = await getDesktopById(deps.sql, op.desktop_id);
  const ids = (op.params as unknown as ForkParams | null)?.desktop_ids ?? [];
  if (!source?.host_id || !deps.agents.isConnected(source.host_id)) return;
  for (const id of ids) {
    const ref = { desktop_id: id, generation: FORK_GENERATION, operation_id: op.id };
    await command(deps, source.host_id, 'desktop.destroy', ref).catch((err: unknown) => {
      deps.logger.warn({ desktopId: id, err }, 'could not remove the copy a failed fork left');
    });
  }
}
