/**
 * The dispatcher's side of the delivery log: turning outbox events into deliveries, claiming due
 * deliveries and recording attempts.
 *
 * Fan-out marks an outbox event dispatched in the same transaction that inserts its deliveries,
 * and a delivery is unique per (event, endpoint), so neither a crash nor a second dispatcher can
 * deliver an event twice to one endpoint or lose it. An endpoint receives the events that
 * happen after it was created.
 *
 * A claim moves the delivery's `next_attempt_at` forward by a lease; the attempt then records its
 * outcome. If the dispatcher dies in between, the lease runs out and the next leader claims the
 * delivery again: deliveries are at least once, and receivers dedupe on the delivery id.
 * Only the oldest pending delivery of each (endpoint, desktop) pair can be claimed, so one
 * desktop's events reach an endpoint in the order they happened.
 */
import { newId } from '../../../shared/src/ids.js';
import { inTransaction, type Sql } from './db.js';

export const OUTBOX_CHANNEL = 'canto_outbox';

export interface OutboxEvent {
  orgId: string;
  type: string;
  payload: Record<string, unknown>;
}

export interface ClaimedDelivery {
  id: string;
  endpoint_id: string;
  /** The endpoint's org: the dispatcher shares its attempts out among orgs. */
  org_id: string;
  event_type: string;
  body: string;
  attempts: number;
  url: string;
  secret_sealed: Buffer;
}

export type AttemptRecord =
  | { state: 'delivered'; status: number }
  | { state: 'pending'; status: number | null; error: string; retryInMs: number }
  | { state: 'failed'; status: number | null; error: string };

/**
 * Turns up to `limit` undispatched outbox events into deliveries, rendering each body once with
 * `render`. Returns how many events were taken.
 *
 * A fan-out waits for one that holds earlier events rather than skip them (no SKIP LOCKED): two
 * overlap at a failover (the old leader stalled mid-round, the new one starting), and a second that
 * went past would give a desktop's later events the earlier delivery `seq`, which is the order the
 * endpoint gets them in. The wait is bounded: a stalled transaction ends at the connection's
 * `idle_in_transaction_session_timeout` (store/db.ts).
 */
export async function fanOutEvents(sql: Sql, limit: number, render: (event: OutboxEvent) => string): Promise<number> {
  return inTransaction(sql, async (tx) => {
    const events = await tx<Array<{ id: string; org_id: string; desktop_id: string; type: string; payload: Record<string, unknown>; created_at: Date }>>`
      SELECT id, org_id, desktop_id, type, payload, created_at FROM outbox
      WHERE dispatched_at IS NULL ORDER BY id LIMIT ${limit} FOR UPDATE`;
    if (events.length === 0) return 0;
    const orgIds = [...new Set(events.map((e) => e.org_id))];
    // Key-share locked: an endpoint deleted meanwhile would fail the deliveries' foreign key and,
    // with it, this whole round; its delete waits for the round instead (its deliveries go with it).
    const endpoints = await tx<Array<{ id: string; org_id: string; events: string[]; created_at: Date }>>`
      SELECT id, org_id, events, created_at FROM webhook_endpoints WHERE org_id = ANY(${orgIds}) ORDER BY created_at, id FOR KEY SHARE`;
    const rows: Array<Record<string, string>> = [];
    for (const e of events) {
      const subscribed = endpoints.filter((w) => w.org_id === e.org_id && w.events.includes(e.type) && w.created_at <= e.created_at);
      if (subscribed.length === 0) continue;
      const body = render({ orgId: e.org_id, type: e.type, payload: e.payload });
      for (const w of subscribed) {
        rows.push({ id: newId('delivery'), endpoint_id: w.id, outbox_id: e.id, desktop_id: e.desktop_id, event_type: e.type, body });
      }
    }
    // Rows go in event order, so `seq` (the delivery log's order) follows the events.
    if (rows.length > 0) {
      await tx`
        INSERT INTO webhook_deliveries ${tx(rows, 'id', 'endpoint_id', 'outbox_id', 'desktop_id', 'event_type', 'body')}
        ON CONFLICT (outbox_id, endpoint_id) DO NOTHING`;
    }
    await tx`UPDATE outbox SET dispatched_at = now() WHERE id = ANY(${events.map((e) => e.id)}::bigint[])`;
    return events.length;
  });
}

/**
 * Claims up to `limit` due deliveries for `leaseMs`, each the oldest pending one of its (endpoint,
 * desktop), none of an org in `skipOrgs` (those at their share of the attempts in flight).
 */
export async function claimDueDeliveries(sql: Sql, limit: number, leaseMs: number, skipOrgs: readonly string[] = []): Promise<ClaimedDelivery[]> {
  return sql<ClaimedDelivery[]>`
    WITH due AS (
      SELECT d.id FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id
      WHERE d.state = 'pending' AND d.next_attempt_at <= now() AND e.org_id <> ALL(${skipOrgs as string[]}::text[])
        AND NOT EXISTS (
          SELECT 1 FROM webhook_deliveries p
          WHERE p.endpoint_id = d.endpoint_id AND p.desktop_id = d.desktop_id AND p.state = 'pending' AND p.seq < d.seq)
      ORDER BY d.next_attempt_at, d.seq LIMIT ${limit}
      FOR UPDATE OF d SKIP LOCKED
    ), claimed AS (
      UPDATE webhook_deliveries w SET next_attempt_at = now() + ${leaseMs}::float8 * interval '1 millisecond'
      FROM due WHERE w.id = due.id
      RETURNING w.id, w.endpoint_id, w.event_type, w.body, w.attempts, w.seq
    )
    SELECT c.id, c.endpoint_id, e.org_id, c.event_type, c.body, c.attempts, e.url, e.secret_sealed
    FROM claimed c JOIN webhook_endpoints e ON e.id = c.endpoint_id
    ORDER BY c.seq`;
}

/**
 * Records the outcome of the attempt claimed when the delivery had `attemptsBefore` attempts. A
 * delivery that was deleted, settled, or attempted again meanwhile is left alone (false).
 */
export async function recordAttempt(sql: Sql, id: string, attemptsBefore: number, r: AttemptRecord): Promise<boolean> {
  const rows = await sql`
    UPDATE webhook_deliveries SET
      attempts = attempts + 1,
      state = ${r.state},
      last_status = ${r.status},
      last_error = ${r.state === 'delivered' ? null : r.error},
      next_attempt_at = ${r.state === 'pending' ? sql`now() + ${r.retryInMs}::float8 * interval '1 millisecond'` : null},
      delivered_at = ${r.state === 'delivered' ? sql`now()` : null}
    WHERE id = ${id} AND state = 'pending' AND attempts = ${attemptsBefore}
    RETURNING id`;
  return rows.length === 1;
}

/** Gives claimed deliveries back, due at once, before their lease would have. */
export async function releaseClaims(sql: Sql, ids: readonly string[]): Promise<void> {
  if (ids.length > 0) await sql`UPDATE webhook_deliveries SET next_attempt_at = now() WHERE id = ANY(${ids as string[]}::text[]) AND state = 'pending'`;
}

/** Calls `onEvent` whenever events are added to the outbox; returns the unsubscribe. */
export async function listenForOutbox(sql: Sql, onEvent: () => void): Promise<() => Promise<void>> {
  const sub = await sql.listen(OUTBOX_CHANNEL, onEvent);
  return () => sub.unlisten();
}

/** The functions above bound to one connection pool, in the shape the dispatcher takes. */
export function deliveryQueue(sql: Sql) {
  return {
    fanOut: (limit: number, render: (event: OutboxEvent) => string) => fanOutEvents(sql, limit, render),
    claim: (limit: number, leaseMs: number, skipOrgs: readonly string[]) => claimDueDeliveries(sql, limit, leaseMs, skipOrgs),
    release: (ids: readonly string[]) => releaseClaims(sql, ids),
    record: (id: string, attemptsBefore: number, outcome: AttemptRecord) => recordAttempt(sql, id, attemptsBefore, outcome),
    listen: (onEvent: () => void) => listenForOutbox(sql, onEvent),
  };
}
