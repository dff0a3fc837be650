/**
 * The event outbox and the awake-seconds meter. Both are written inside the transaction that
 * changes a desktop's state, so an event or a meter interval exists exactly when its state
 * change committed.
 */
import type { Sql } from './db.js';
import { newId } from '../../../shared/src/ids.js';

export type EventType = 'desktop.created' | 'desktop.woken' | 'desktop.hibernated' | 'desktop.destroyed';

export async function recordEvent(
  sql: Sql,
  e: { orgId: string; desktopId: string; type: EventType; data?: Record<string, unknown> },
): Promise<void> {
  // `eventId` names the event itself, the same in every endpoint's delivery and in every retry.
  const payload = {
    eventId: newId('event'),
    type: e.type,
    desktopId: e.desktopId,
    orgId: e.orgId,
    data: e.data ?? {},
  };
  // `occurredAt` is the database's clock, read in the transaction that changed the desktop (its
  // row locked): one clock for every replica, so one desktop's events never run backwards when a
  // leader with a clock ahead hands over to one behind it. Formatted as Date.toISOString does.
  await sql`
    INSERT INTO outbox (org_id, desktop_id, type, payload) VALUES (${e.orgId}, ${e.desktopId}, ${e.type},
      ${sql.json(payload as never)}::jsonb || jsonb_build_object('occurredAt', to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')))`;
}

export async function openMeter(sql: Sql, orgId: string, desktopId: string): Promise<void> {
  await sql`
    INSERT INTO meter_intervals (org_id, desktop_id, started_at) VALUES (${orgId}, ${desktopId}, now())
    ON CONFLICT (desktop_id) WHERE ended_at IS NULL DO NOTHING`;
}

/**
 * Closes the desktop's open interval, now or at `at` (when a silent host was last heard from):
 * never before the interval began, never in the future.
 */
export async function closeMeter(sql: Sql, desktopId: string, at: Date | null = null): Promise<void> {
  await sql`
    UPDATE meter_intervals SET ended_at = GREATEST(started_at, LEAST(now(), COALESCE(${at}::timestamptz, now())))
    WHERE desktop_id = ${desktopId} AND ended_at IS NULL`;
}

export interface UsageRows {
  desktops: Array<{ id: string; tier: string; billing_mode: string; created_at: Date; destroyed_at: Date | null }>;
  intervals: Array<{ desktop_id: string; started_at: Date; ended_at: Date | null }>;
}

export async function usageRows(sql: Sql, orgId: string, start: Date, end: Date): Promise<UsageRows> {
  const desktops = await sql<UsageRows['desktops']>`
    SELECT id, tier, billing_mode, created_at, destroyed_at FROM desktops
    WHERE org_id = ${orgId} AND created_at <= ${end} AND (destroyed_at IS NULL OR destroyed_at >= ${start})`;
  const intervals = await sql<UsageRows['intervals']>`
    SELECT desktop_id, started_at, ended_at FROM meter_intervals
    WHERE org_id = ${orgId} AND started_at <= ${end} AND (ended_at IS NULL OR ended_at >= ${start})`;
  return { desktops, intervals };
}
