/**
 * Operation rows: the durable record of every wake, hibernate, destroy and fork. A row is
 * created in the same transaction as the desktop's state change; the leader's engine claims
 * pending rows with `FOR UPDATE SKIP LOCKED` and settles them. Settling announces itself on the
 * `canto_op_settled` channel so `?wait=true` answers at once on every replica.
 */
import { newId } from '../../../shared/src/ids.js';
import type { Sql } from './db.js';
import type { DesktopState, OperationError, OperationKind, OperationRow } from './rows.js';
import { termHolds } from './leases.js';

export const OP_NEW_CHANNEL = 'canto_op_new';
export const OP_SETTLED_CHANNEL = 'canto_op_settled';

export interface NewOperation {
  orgId: string;
  desktopId: string;
  kind: OperationKind;
  idempotencyKey: string | null;
  fromState: DesktopState;
  reason?: string;
  /** Insert already failed (a stale `expected_generation`, no capacity for a fork). */
  failed?: OperationError;
  params?: Record<string, unknown>;
}

/** Records an operation; a pending one wakes the leader's engine in the same statement. */
export async function insertOperation(sql: Sql, op: NewOperation): Promise<OperationRow> {
  const state = op.failed ? 'failed' : 'pending';
  // One round trip: the notification rides the insert (delivered at commit, as a second
  // statement's would be). A lateral select runs once per inserted row, and adds no column.
  const [row] = await sql<OperationRow[]>`
    WITH o AS (
      INSERT INTO operations (id, org_id, desktop_id, kind, state, idempotency_key, from_state, reason, error, params, settled_at)
      VALUES (${newId('operation')}, ${op.orgId}, ${op.desktopId}, ${op.kind}, ${state}, ${op.idempotencyKey},
              ${op.fromState}, ${op.reason ?? 'requested'}, ${op.failed ? sql.json(op.failed as never) : null},
              ${op.params ? sql.json(op.params as never) : null}, ${op.failed ? sql`now()` : null})
      RETURNING *)
    SELECT o.* FROM o CROSS JOIN LATERAL (SELECT CASE WHEN o.state = 'pending' THEN pg_notify(${OP_NEW_CHANNEL}, o.id) END) AS n`;
  return row!;
}

/** Wakes the leader's engine, on whichever replica it runs: an operation or a desktop awaits it. */
export async function notifyNewWork(sql: Sql, id: string): Promise<void> {
  await sql`SELECT pg_notify(${OP_NEW_CHANNEL}, ${id})`;
}

export async function getOperation(sql: Sql, orgId: string, id: string): Promise<OperationRow | null> {
  const [row] = await sql<OperationRow[]>`SELECT * FROM operations WHERE id = ${id} AND org_id = ${orgId}`;
  return row ?? null;
}

export async function operationByKey(sql: Sql, desktopId: string, key: string): Promise<OperationRow | null> {
  const [row] = await sql<OperationRow[]>`
    SELECT * FROM operations WHERE desktop_id = ${desktopId} AND idempotency_key = ${key}`;
  return row ?? null;
}

/**
 * Claims pending operations for this engine, oldest first, fenced on its term like a settlement:
 * a replica that no longer leads claims nothing. (One it claimed would stay `running` with
 * nothing driving it, since the next leader re-drives running operations only when its term starts.)
 */
export async function claimPending(sql: Sql, limit: number, fence: SettleFence): Promise<OperationRow[]> {
  return sql<OperationRow[]>`
    UPDATE operations SET state = 'running', started_at = COALESCE(started_at, now()), attempts = attempts + 1
    WHERE id IN (
      SELECT id FROM operations WHERE state = 'pending' ORDER BY created_at LIMIT ${limit} FOR UPDATE SKIP LOCKED
    )
      AND ${termHolds(sql, fence)}
    RETURNING *`;
}

/** An operation's params as the database holds them (a move's phase: engine/move.ts). */
export async function operationParams(sql: Sql, id: string): Promise<Record<string, unknown> | null> {
  const [row] = await sql<Array<{ params: Record<string, unknown> | null }>>`SELECT params FROM operations WHERE id = ${id}`;
  return row?.params ?? null;
}

/** Operations a previous leader started and never settled. */
export async function runningOperations(sql: Sql): Promise<OperationRow[]> {
  return sql<OperationRow[]>`SELECT * FROM operations WHERE state = 'running' ORDER BY created_at`;
}

/** The desktop's operation not yet settled (the oldest, should there be several), or null. */
export async function openOperation(sql: Sql, desktopId: string): Promise<{ id: string; kind: string } | null> {
  const [row] = await sql<Array<{ id: string; kind: string }>>`
    SELECT id, kind FROM operations WHERE desktop_id = ${desktopId} AND state IN ('pending', 'running') ORDER BY created_at LIMIT 1`;
  return row ?? null;
}

/** The leader term an engine settles under (engine/leader.ts). */
export interface SettleFence {
  readonly holder: string;
  readonly epoch: number;
}

/**
 * Settles a running operation. `fence` stops a deposed leader: the update happens only while
 * that replica still holds the leader lease, in the same term.
 */
export async function settleOperation(
  sql: Sql,
  id: string,
  outcome: { result: Record<string, unknown> } | { error: OperationError },
  fence: SettleFence,
): Promise<boolean> {
  // The notification rides the update, for the row it settled (one round trip, not two).
  const rows = await sql`
    WITH s AS (
      UPDATE operations SET
        state = ${'result' in outcome ? 'succeeded' : 'failed'},
        result = ${'result' in outcome ? sql.json(outcome.result as never) : null},
        error = ${'error' in outcome ? sql.json(outcome.error as never) : null},
        settled_at = now()
      WHERE id = ${id} AND state = 'running'
        AND ${termHolds(sql, fence)}
      RETURNING id)
    SELECT pg_notify(${OP_SETTLED_CHANNEL}, s.id) FROM s`;
  return rows.length === 1;
}
