/**
 * Desktops a lost host holds that are not lost with it. A move commits a desktop to its target
 * before starting it there and destroys the source's copy only once it runs (engine/move.ts).
 * When the target goes away in between and the move fails on the start, the desktop is recorded
 * hibernated on the target, and the source keeps the copy the move stopped, disk and memory,
 * exactly what the target was given: engine/stale-copies.ts does not sweep it while the target is
 * away (`keptForTarget`). If the target is then declared lost, that copy is the desktop: it is
 * placed back on the source, hibernated, rather than written off with the host.
 *
 * Only when nothing can have changed it since, and the copy can only still be there: the move is
 * the desktop's last, it failed before the desktop ran on the target (its phase stayed
 * `committed`), the target was not heard from after the move failed (had it come back, the
 * desktop may have run there, and the source's copy may have been swept), no operation since
 * succeeded and no destroy was asked for, and the source is not lost itself. A source that is only
 * down keeps the desktop waiting there, as any desktop on a host that is down; should its copy be
 * gone after all (a wiped state directory), its hello says so and a wake fails with
 * `disk_missing` (engine/stale-copies.ts `missingDisks`), which the operator is told.
 */
import { inTransaction, type Sql } from '../store/db.js';
import { transition } from '../store/desktops.js';
import { failedBeforeRunning, lastMove } from '../store/moves.js';

/** As the admin API shows it (`placed_back` of a forget). */
export interface PlacedBack {
  readonly desktop_id: string;
  /** The move's source, where the desktop is now. */
  readonly host_id: string;
  readonly move_id: string;
}

/** Places back on their moves' sources the desktops of `lostHostId` that only a move left there. */
export async function placeBackOnSources(sql: Sql, lostHostId: string): Promise<PlacedBack[]> {
  return inTransaction(sql, async (tx) => {
    const candidates = await tx<Array<{ id: string }>>`
      SELECT d.id FROM desktops d ${lastMove(tx)}
      WHERE d.host_id = ${lostHostId} AND d.state = 'hibernated' AND ${failedBeforeRunning(tx)}
      ORDER BY d.id
      FOR UPDATE OF d`;
    if (candidates.length === 0) return [];
    // Read again under the locks, in a statement of its own: the first one's snapshot predates
    // the lock waits, and a request that only inserted an operation (a destroy, a fork) while
    // holding a row's lock did not change the row that statement re-checked.
    const rows = await tx<Array<{ id: string; generation: number; source: string; move_id: string }>>`
      SELECT d.id, d.generation, m.params->>'source_host_id' AS source, m.id AS move_id
      FROM desktops d ${lastMove(tx)}
      WHERE d.id = ANY(${candidates.map((c) => c.id)}::text[]) AND d.host_id = ${lostHostId} AND d.state = 'hibernated'
        AND ${failedBeforeRunning(tx)}
        AND (SELECT h.last_seen_at FROM hosts h WHERE h.id = ${lostHostId}) <= m.settled_at
        AND EXISTS (SELECT 1 FROM hosts h WHERE h.id = m.params->>'source_host_id' AND h.lost_at IS NULL)
      ORDER BY d.id`;
    const placed: PlacedBack[] = [];
    for (const r of rows) {
      // The generation bump fences anything the lost host might still send about it.
      const moved = await transition(tx, r.id, ['hibernated'], 'hibernated', { hostId: r.source, expectGeneration: r.generation });
      if (moved === null) continue;
      placed.push({ desktop_id: r.id, host_id: r.source, move_id: r.move_id });
    }
    return placed;
  });
}
