/**
 * Moves and drains as the database holds them: a move is an operation of kind `move` (its
 * phases in params, engine/move.ts); a drain is four columns of its host (migration 8) plus the
 * moves that carry its name. Nothing about a drain lives only in a replica's memory, so a new
 * leader carries on with it.
 */
import { inTransaction, type Sql } from './db.js';
import { assertTerm } from './leases.js';
import { insertOperation, openOperation, type SettleFence } from './operations.js';
import type { DesktopRow, HostRow, OperationRow } from './rows.js';
import type { MoveParams } from '../engine/move.js';

export interface MoveRequest {
  requestedHostId: string | null;
  reason: 'admin' | 'drain';
  /** The drain this move belongs to: its host's `drain_requested_at`, ISO. */
  drain: string | null;
}

/**
 * Records a move of the desktop, under its row lock like every lifecycle request, so a move and
 * a user's wake or hibernate can never both be open. Null when the desktop cannot move now: not
 * on a host, not awake or hibernated, or another operation on it is open.
 */
export async function insertMove(sql: Sql, desktopId: string, req: MoveRequest, term?: SettleFence): Promise<{ op: OperationRow } | { refused: string }> {
  return inTransaction(sql, async (tx) => {
    const [d] = await tx<DesktopRow[]>`SELECT * FROM desktops WHERE id = ${desktopId} FOR UPDATE`;
    if (!d) return { refused: 'not_found' };
    if (!d.host_id || (d.state !== 'awake' && d.state !== 'hibernated')) return { refused: `the desktop is ${d.state}; only awake and hibernated desktops on a host move` };
    if (req.requestedHostId === d.host_id) return { refused: 'the desktop is already on that host' };
    const open = await openOperation(tx, d.id);
    if (open) return { refused: `the desktop's ${open.kind} (operation ${open.id}) is in progress; retry once it settles` };
    // A drain's move (engine/drainer.ts) is the leader's: LeaseLost past its term, checked after
    // the lock waits above and held to the commit.
    if (term) await assertTerm(tx, term);
    const params: MoveParams = { phase: 'accepted', source_host_id: d.host_id, requested_host_id: req.requestedHostId, drain: req.drain };
    const op = await insertOperation(tx, {
      orgId: d.org_id,
      desktopId: d.id,
      kind: 'move',
      idempotencyKey: null,
      fromState: d.state,
      reason: req.reason,
      params: params as unknown as Record<string, unknown>,
    });
    return { op };
  });
}

/** Any operation, of any org: the admin API's view. */
export async function operationById(sql: Sql, id: string): Promise<OperationRow | null> {
  const [row] = await sql<OperationRow[]>`SELECT * FROM operations WHERE id = ${id}`;
  return row ?? null;
}

/** Notified with the host's id when a drain is asked for: the leader's drainer passes at once (engine/drainer.ts). */
export const DRAIN_CHANNEL = 'canto_drain';

/**
 * Starts the host's drain and cordons it. A drain that runs keeps running (with the new
 * `parallel`, or its own when none is given); one stopped by a failed move is resumed: its error cleared, the failures before
 * now no longer counted (`drain_resumed_at`), what it moved still counted (the same start).
 * Every SET expression reads the row as it was before the update.
 */
export async function startDrain(sql: Sql, hostId: string, parallel: number | null, defaultParallel: number): Promise<HostRow | null> {
  // Asked again without `parallel` (a second `--wait`, a resume), a drain keeps its own.
  const [row] = await sql<HostRow[]>`
    UPDATE hosts SET cordoned = true,
      drain_parallel = COALESCE(${parallel}::int, CASE WHEN drain_requested_at IS NOT NULL AND drain_finished_at IS NULL THEN drain_parallel END, ${defaultParallel}::int),
      drain_error = NULL, drain_finished_at = NULL,
      drain_requested_at = CASE WHEN drain_requested_at IS NULL OR drain_finished_at IS NOT NULL THEN now() ELSE drain_requested_at END,
      drain_resumed_at = CASE WHEN drain_requested_at IS NULL OR drain_finished_at IS NOT NULL THEN NULL
                              WHEN drain_error IS NOT NULL THEN now() ELSE drain_resumed_at END
    WHERE id = ${hostId} RETURNING *`;
  // The leader's drainer starts at once, whichever replica was asked.
  if (row !== undefined) await sql`SELECT pg_notify(${DRAIN_CHANNEL}, ${hostId})`;
  return row ?? null;
}

/** Ends a drain, done or stopped short with `error`. */
/** Ends the drain, finished or stopped by `error`; fenced on the term of the leader whose drainer ends it. */
export async function endDrain(sql: Sql, hostId: string, error: string | null, term: SettleFence): Promise<void> {
  await inTransaction(sql, async (tx) => {
    await assertTerm(tx, term);
    if (error === null) await tx`UPDATE hosts SET drain_finished_at = now(), drain_error = NULL WHERE id = ${hostId} AND drain_finished_at IS NULL`;
    else await tx`UPDATE hosts SET drain_error = ${error} WHERE id = ${hostId} AND drain_finished_at IS NULL`;
  });
}

/** Uncordoning a host stops its drain: the operator wants it in service. */
export async function cancelDrain(sql: Sql, hostId: string): Promise<void> {
  await sql`UPDATE hosts SET drain_requested_at = NULL, drain_parallel = NULL, drain_finished_at = NULL, drain_error = NULL, drain_resumed_at = NULL WHERE id = ${hostId}`;
}

export type DrainState = 'draining' | 'drained' | 'stopped';

/** A host's drain as its row records it; null when none was asked for (or an uncordon ended it). */
export function drainState(h: Pick<HostRow, 'drain_requested_at' | 'drain_finished_at' | 'drain_error'>): DrainState | null {
  if (h.drain_requested_at === null) return null;
  return h.drain_finished_at ? 'drained' : h.drain_error ? 'stopped' : 'draining';
}

/** Hosts whose drain runs: asked for, not finished, not stopped by an error. */
export async function activeDrains(sql: Sql): Promise<HostRow[]> {
  return sql<HostRow[]>`SELECT * FROM hosts WHERE drain_requested_at IS NOT NULL AND drain_finished_at IS NULL AND drain_error IS NULL`;
}

export interface DrainCounts {
  /** Desktops still on the host (not destroyed). */
  remaining: number;
  /** Of those, the ones no move has taken yet: with `moved` and `running`, each desktop counted once. */
  waiting: number;
  /** Moves of this drain by state. */
  moved: number;
  failed: number;
  running: number;
  /**
   * Of the running ones, those whose desktop is not on the target yet (committed, and started
   * there if it was awake): what is left of a move then is removing the source's copy, which does
   * not hold a place among the drain's parallel moves.
   */
  copying: number;
  /** Bytes the drain's settled moves copied, and what its running ones will copy. */
  moved_bytes: number;
  total_bytes: number;
  /** Hosts its running moves copy to that are down (by id): those moves wait for their agents. */
  down_targets: string[];
}

export async function drainCounts(sql: Sql, host: HostRow): Promise<DrainCounts> {
  const drain = host.drain_requested_at?.toISOString() ?? '';
  // One statement, so one snapshot: read apart, a move the drainer created between the two
  // readings counted both as waiting and as running.
  const [c] = await sql<Array<{
    n: number; waiting: number; moved: number; failed: number; running: number; copying: number; moved_bytes: string; total_bytes: string; down_targets: string[];
  }>>`
    WITH held AS (
      SELECT count(*)::int AS n,
             count(*) FILTER (WHERE NOT EXISTS (
               SELECT 1 FROM operations o WHERE o.desktop_id = d.id AND o.kind = 'move' AND o.state IN ('pending', 'running')))::int AS waiting
      FROM desktops d WHERE d.host_id = ${host.id} AND d.state <> 'destroyed'
    ), ops AS (
      SELECT count(*) FILTER (WHERE state = 'succeeded')::int AS moved,
             count(*) FILTER (WHERE state = 'failed' AND settled_at >= COALESCE((SELECT drain_resumed_at FROM hosts WHERE id = ${host.id}), '-infinity'))::int AS failed,
             count(*) FILTER (WHERE state IN ('pending', 'running'))::int AS running,
             count(*) FILTER (WHERE state IN ('pending', 'running') AND COALESCE(params->>'phase', '') <> 'started')::int AS copying,
             COALESCE(sum(CASE WHEN state = 'succeeded' THEN (result->>'total_bytes')::bigint
                               WHEN state = 'running' THEN COALESCE((params->>'total_bytes')::bigint, (params->>'copy_done_bytes')::bigint)
                          END), 0) AS moved_bytes,
             COALESCE(sum(COALESCE((result->>'total_bytes')::bigint, (params->>'total_bytes')::bigint, (params->>'copy_total_bytes')::bigint, 0)), 0) AS total_bytes
      FROM operations WHERE kind = 'move' AND params->>'source_host_id' = ${host.id} AND params->>'drain' = ${drain}
    ), waits AS (
      SELECT COALESCE(array_agg(DISTINCT h.id ORDER BY h.id), '{}') AS down_targets
      FROM operations o JOIN hosts h ON h.id = o.params->>'target_host_id'
      WHERE o.kind = 'move' AND o.params->>'source_host_id' = ${host.id} AND o.params->>'drain' = ${drain}
        AND o.state IN ('pending', 'running') AND h.status = 'down'
    )
    SELECT * FROM held, ops, waits`;
  return {
    remaining: c!.n,
    waiting: c!.waiting,
    moved: c!.moved,
    failed: c!.failed,
    running: c!.running,
    copying: c!.copying,
    moved_bytes: Number(c!.moved_bytes),
    total_bytes: Number(c!.total_bytes),
    down_targets: c!.down_targets,
  };
}

/**
 * The next desktops a drain may move: on the host, awake or hibernated, with no operation open
 * (one waking or hibernating is left until it settles). Awake ones first: their users notice.
 */
export async function drainCandidates(sql: Sql, hostId: string, limit: number): Promise<DesktopRow[]> {
  return sql<DesktopRow[]>`
    SELECT d.* FROM desktops d
    WHERE d.host_id = ${hostId} AND d.state IN ('awake', 'hibernated')
      AND NOT EXISTS (SELECT 1 FROM operations o WHERE o.desktop_id = d.id AND o.state IN ('pending', 'running'))
    ORDER BY (d.state = 'awake') DESC, d.created_at
    LIMIT ${limit}`;
}

/**
 * A running move's copy so far, from the target's progress notifications: written while the move
 * is in its copy phase only, so a late notification cannot touch a later phase's params.
 */
export async function recordCopyProgress(sql: Sql, desktopId: string, doneBytes: number, totalBytes: number): Promise<void> {
  await sql`
    UPDATE operations SET params = params || ${sql.json({ copy_done_bytes: doneBytes, copy_total_bytes: totalBytes })}::jsonb
    WHERE desktop_id = ${desktopId} AND kind = 'move' AND state = 'running' AND params->>'phase' = 'stopped'`;
}

/** The latest failed move of the drain, for the reason it stopped. */
export async function lastFailedMove(sql: Sql, host: HostRow): Promise<OperationRow | null> {
  const drain = host.drain_requested_at?.toISOString() ?? '';
  // The resume as the row holds it (microseconds), not as a Date rounds it.
  const [row] = await sql<OperationRow[]>`
    SELECT * FROM operations WHERE kind = 'move' AND state = 'failed' AND params->>'source_host_id' = ${host.id} AND params->>'drain' = ${drain}
      AND settled_at >= COALESCE((SELECT drain_resumed_at FROM hosts WHERE id = ${host.id}), '-infinity')
    ORDER BY settled_at DESC LIMIT 1`;
  return row ?? null;
}

/**
 * SQL condition on a desktop `d` (a desktops row) and `m`, its last move: the move failed after
 * its commit and before the desktop ran on its target, which is the host `d` is recorded on. The
 * sweep of stale copies and the placing back both use it, so that the sweep keeps exactly the
 * copies a forget may place a desktop back on.
 */
export function failedBeforeRunning(sql: Sql) {
  return sql`
    m.state = 'failed' AND m.params->>'phase' = 'committed' AND m.params->>'target_host_id' = d.host_id
    AND NOT EXISTS (
      SELECT 1 FROM operations o WHERE o.desktop_id = d.id AND o.id <> m.id AND o.created_at >= m.created_at
        AND (o.state IN ('pending', 'running', 'succeeded') OR o.kind = 'destroy'))`;
}

/** SQL: `m`, the last move of the desktop `d`, joined laterally. */
export function lastMove(sql: Sql) {
  return sql`
    JOIN LATERAL (
      SELECT o.id, o.state, o.params, o.created_at, o.settled_at FROM operations o
      WHERE o.desktop_id = d.id AND o.kind = 'move' ORDER BY o.created_at DESC, o.id DESC LIMIT 1
    ) m ON true`;
}
