/**
 * Desktops a lost host holds that are not lost with it. A move commits a desktop to its target
 * before starting it there and destroys the source's copy only once it runs (engine/move.ts).
 * When the target goes away in between and the move fails on the start, the desktop is recorded
 * hibernated on the target, and the source keeps the copy the move stopped, disk and memory,
 * exactly what the target was given (engine/stale-copies.ts does not sweep a copy whose record
 * names a host that is down). If the target is then declared lost, that copy is the desktop: it
 * is placed back on the source, hibernated, rather than written off with the host.
 *
 * Only when nothing can have changed it since: the move is the desktop's last, it failed before
 * the desktop ran on the target (its phase stayed `committed`), no operation since succeeded (a
 * wake that did would have shown its user a newer desktop than the source's copy), and the
 * source is not lost itself. A source that is only down keeps the desktop waiting there, as any
 * desktop on a host that is down; if its copy turns out to be gone, its hello says so and a wake
 * fails with `disk_missing` (engine/stale-copies.ts `missingDisks`), which the operator is told.
 */
import { inTransaction, type Sql } from '../store/db.js';
import { transition } from '../store/desktops.js';

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
    const rows = await tx<Array<{ id: string; generation: number; source: string; move_id: string }>>`
      SELECT d.id, d.generation, m.params->>'source_host_id' AS source, m.id AS move_id
      FROM desktops d
      JOIN LATERAL (
        SELECT o.id, o.state, o.params, o.created_at FROM operations o
        WHERE o.desktop_id = d.id AND o.kind = 'move' ORDER BY o.created_at DESC, o.id DESC LIMIT 1
      ) m ON true
      WHERE d.host_id = ${lostHostId} AND d.state = 'hibernated'
        AND m.state = 'failed' AND m.params->>'target_host_id' = ${lostHostId} AND m.params->>'phase' = 'committed'
        AND EXISTS (SELECT 1 FROM hosts h WHERE h.id = m.params->>'source_host_id' AND h.lost_at IS NULL)
        AND NOT EXISTS (
          SELECT 1 FROM operations o WHERE o.desktop_id = d.id AND o.id <> m.id AND o.created_at >= m.created_at
            AND o.state IN ('pending', 'running', 'succeeded'))
      ORDER BY d.id
      FOR UPDATE OF d`;
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
