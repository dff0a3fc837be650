/**
 * Desktops recorded awake that their host no longer runs (engine.ts asks after a relink, a new
 * leader term, and a guest call that found one not running).
 */
import { inTransaction } from '../store/db.js';
import { getDesktopById, transition } from '../store/desktops.js';
import { closeMeter, recordEvent } from '../store/events.js';
import { assertTerm, inspect, type StepDeps } from './steps.js';

/**
 * An agent relinked, or a guest call found the desktop not running: a desktop recorded awake on
 * its host, with no operation open, must still be running there. Asked afresh (queued behind any
 * command the host is still running for it), a host that no longer runs it (rebooted, its
 * processes killed with a crashed `canto up`, its guest dead) gets it recorded hibernated:
 * generation bumped, `desktop.hibernated` with reason `host_failure` and `cause: guest_gone`, and
 * the meter closed when the previous agent was last heard from (`meterEnd` 'previous_agent', after
 * a relink) or now (after a guest call, when the death itself was not seen). Its disk is there; a
 * memory snapshot, if the host kept one, is what the next wake restores.
 */
/** How soon after an agent restart a relink still speaks of that restart (its hellos to every replica). */
const RESTART_RELINK_MS = 60_000;

export async function reconcileAwake(deps: StepDeps, relinked: string | null, desktopId: string, meterEnd: 'previous_agent' | 'now' = 'previous_agent'): Promise<void> {
  const d = await getDesktopById(deps.sql, desktopId);
  // `relinked`: the host that said hello (the desktop must still be on it); null, whichever it is on.
  const hostId = d?.host_id;
  if (!d || !hostId || (relinked !== null && hostId !== relinked) || d.state !== 'awake' || !deps.leading()) return;
  const held = await inspect(deps, hostId, desktopId);
  if (held === null || held.running) return;
  const moved = await inTransaction(deps.sql, async (tx) => {
    const [open] = await tx`SELECT 1 FROM operations WHERE desktop_id = ${d.id} AND state IN ('pending', 'running') LIMIT 1`;
    if (open) return null;
    // The leader's judgement, written only in its term (a stalled one's ends in LeaseLost).
    await assertTerm(tx, deps.fence);
    const done = await transition(tx, d.id, ['awake'], 'hibernated', { expectGeneration: d.generation });
    if (!done) return null;
    // The previous agent's last sighting says when the guest went only on the relink right after
    // that agent's restart (a reboot took the guest with it); later, the guest may have outlived
    // the restart and died any time since. (closeMeter never closes before the meter opened: a
    // heartbeat's sighting is up to a second coarse.)
    const [host] = meterEnd === 'now' ? [] : await tx<Array<{ at: Date | null }>>`
      SELECT CASE WHEN instance_since > now() - make_interval(secs => ${RESTART_RELINK_MS / 1000}) THEN previous_seen_at END AS at
      FROM hosts WHERE id = ${hostId}`;
    await closeMeter(tx, d.id, host?.at ?? null);
    await recordEvent(tx, {
      orgId: d.org_id,
      desktopId: d.id,
      type: 'desktop.hibernated',
      data: { reason: 'host_failure', cause: 'guest_gone', host_id: hostId, memory_snapshot: held.has_snapshot },
    });
    return done;
  });
  if (moved) {
    const how = meterEnd === 'now' ? 'a guest call found it not running' : 'it was gone from its relinked host';
    deps.logger.warn({ desktopId, hostId, snapshot: held.has_snapshot }, `desktop recorded awake: ${how}; recorded hibernated`);
  }
}
