/**
 * Stale copies: a host that comes back may still hold desktops that are no longer its own. A move
 * whose source was unreachable when it finished leaves the source's copy behind (the desktop was
 * committed on the target, so nothing waited for the source); a desktop destroyed while its host
 * was away leaves its disk there. Such a copy is dead weight at best, and at worst makes a later
 * move back to that host fail on "another copy is here".
 *
 * When a host says hello (and when a leader's term begins, for the hosts already linked), the
 * leader compares what the host reported holding with the records, and destroys each copy whose
 * record is destroyed or places the desktop on another host, provided no operation on the desktop
 * is pending or running (a move under way legitimately has a copy on both hosts). One copy stays:
 * the source's, of a move whose target went away after the commit, before the desktop ran there,
 * while that target is still away. It is the only copy sure to exist, and what the desktop is
 * placed back on should the target be declared lost (admin/move-sources.ts, whose condition this
 * shares); it goes at a hello after the target is back. It runs in the
 * desktop's queue of the engine, so no operation on the desktop starts meanwhile. A copy with no
 * record is the leftover of a failed fork when a failed fork operation names it (its copies were
 * to be removed when it failed, but the host was out of reach, the leader stopped, or a copy was
 * made after the removal); any other is left alone and logged: it is not provably this
 * deployment's to delete.
 */
import type { HelloDesktops } from '../agents/gateway.js';
import { command, FORK_GENERATION, LeaseLost, type StepDeps } from './steps.js';
import { failedBeforeRunning, lastMove } from '../store/moves.js';

export interface StaleCopy {
  readonly desktopId: string;
  /** The record's generation: the destroy carries it, so the host's fence lets it through. */
  readonly generation: number;
  readonly reason: 'destroyed' | 'placed_elsewhere' | 'failed_fork';
}

/** The reported desktops the records say are not this host's to keep, checked one by one. */
export async function staleCopies(deps: Pick<StepDeps, 'sql'>, hostId: string, reported: HelloDesktops): Promise<StaleCopy[]> {
  if (reported.length === 0) return [];
  const rows = await deps.sql<Array<{ id: string; state: string; host_id: string | null; generation: number; open: boolean; kept: boolean }>>`
    SELECT d.id, d.state, d.host_id, d.generation,
           EXISTS (SELECT 1 FROM operations o WHERE o.desktop_id = d.id AND o.state IN ('pending', 'running')) AS open,
           COALESCE((SELECT h.status <> 'ready' OR h.lost_at IS NOT NULL FROM hosts h WHERE h.id = d.host_id), false)
             AND EXISTS (
               SELECT 1 FROM (SELECT 1) AS one ${lastMove(deps.sql)}
               WHERE m.params->>'source_host_id' = ${hostId} AND ${failedBeforeRunning(deps.sql)}
             ) AS kept
    FROM desktops d WHERE d.id = ANY(${reported.map((r) => r.desktop_id)}::text[])`;
  const out: StaleCopy[] = [];
  // The host's fence may be ahead of the record (an import made there carries the generation its
  // commit would have given; a rolled-back move never gave it): the destroy must pass that fence.
  const held = new Map(reported.map((r) => [r.desktop_id, r.generation]));
  for (const r of rows) {
    if (r.open) continue;
    const generation = Math.max(r.generation, held.get(r.id) ?? 0);
    if (r.state === 'destroyed') out.push({ desktopId: r.id, generation, reason: 'destroyed' });
    else if (r.host_id !== null && r.host_id !== hostId && !r.kept) out.push({ desktopId: r.id, generation, reason: 'placed_elsewhere' });
  }
  const unknown = reported.map((r) => r.desktop_id).filter((id) => !rows.some((r) => r.id === id));
  if (unknown.length > 0) {
    const forks = await deps.sql<Array<{ id: string }>>`
      SELECT DISTINCT ids.id FROM operations o, jsonb_array_elements_text(o.params->'desktop_ids') AS ids(id)
      WHERE o.kind = 'fork' AND o.state = 'failed' AND ids.id = ANY(${unknown}::text[])`;
    for (const f of forks) out.push({ desktopId: f.id, generation: FORK_GENERATION, reason: 'failed_fork' });
  }
  return out;
}

/**
 * The desktops recorded on the host, placed and not destroyed, with no operation open, that its
 * hello did not list: their disks are not there (a state directory wiped or replaced under the
 * same host identity). Nothing is changed: a wake of one fails with `disk_missing`, and the
 * operator is told (engine.ts logs it) to bring the disk back.
 */
export async function missingDisks(deps: Pick<StepDeps, 'sql'>, hostId: string, reported: HelloDesktops): Promise<string[]> {
  const rows = await deps.sql<Array<{ id: string }>>`
    SELECT d.id FROM desktops d
    WHERE d.host_id = ${hostId} AND d.state NOT IN ('destroyed', 'provisioning') AND NOT (d.id = ANY(${reported.map((r) => r.desktop_id)}::text[]))
      AND NOT EXISTS (SELECT 1 FROM operations o WHERE o.desktop_id = d.id AND o.state IN ('pending', 'running'))
    ORDER BY d.id`;
  return rows.map((r) => r.id);
}

/** Destroys one stale copy on the host, if it is still stale by the records. */
export async function removeStaleCopy(deps: StepDeps, hostId: string, desktopId: string, heldGeneration = 0): Promise<boolean> {
  const [copy] = await staleCopies(deps, hostId, [{ desktop_id: desktopId, generation: heldGeneration, running: false, has_snapshot: false }]);
  if (copy === undefined) return false;
  try {
    await command(deps, hostId, 'desktop.destroy', { desktop_id: desktopId, generation: copy.generation, operation_id: `stale-copy:${copy.reason}` });
  } catch (err) {
    if (err instanceof LeaseLost) throw err;
    deps.logger.warn({ err, desktopId, hostId, reason: copy.reason }, 'a stale copy could not be removed; the next hello tries again');
    return false;
  }
  deps.logger.info({ desktopId, hostId, reason: copy.reason }, 'removed a stale copy of a desktop from a returning host');
  return true;
}
