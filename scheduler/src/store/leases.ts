/**
 * Named leases in PostgreSQL: a row per lease, held by one replica until `expires_at`. A lease
 * row (rather than a session advisory lock) survives postgres.js reconnecting underneath us: a
 * silently re-established session would have lost an advisory lock without anyone noticing.
 *
 * Each term of a lease has an epoch, one more than the term before: a new holder starts a term,
 * and so does a holder renewing a lease that had already lapsed (someone else could have held it
 * in between, as far as anyone acting on the old term can tell). Releasing expires the row rather
 * than deleting it, so epochs only ever grow.
 */
import type { Sql } from './db.js';

/** Notified (payload: the lease name) when a holder releases a lease, so others take it at once. */
export const LEASE_RELEASED_CHANNEL = 'canto_lease_released';
/** The lease whose holder leads: runs the engine, and fences settlements on its epoch. */
export const LEADER_LEASE = 'leader';

export interface LeaseTerm {
  /** True when `holder` holds the lease after the attempt. */
  readonly held: boolean;
  /** The term's epoch when held; 0 otherwise. */
  readonly epoch: number;
}

/**
 * The process asking, beside its replica id: `id` is its own (random, per process start), and
 * `fresh` says it has not held the lease yet. A process restarted under the same replica id takes
 * the lease over at once (a restart need not wait out the TTL) but in a new term, so a previous
 * process that was frozen rather than dead finds its renewals refused and its commits fenced,
 * instead of sharing a term with the new one.
 */
export interface LeaseInstance {
  readonly id: string;
  readonly fresh: boolean;
}

/**
 * Awaits a lease statement for at most `ms` (none: no bound), cancelling it on the server past
 * that: a renewal stuck behind a row lock, or on a link that went silent, must not keep its
 * caller past the lease's own life, nor land later and extend a lease its holder gave up on. The
 * wait ends at the bound even when the cancel cannot reach the server.
 */
async function bounded<T>(query: Promise<T> & { cancel(): unknown }, ms: number | undefined, what: string): Promise<T> {
  if (ms === undefined) return query;
  let timer: NodeJS.Timeout | undefined;
  const expired = new Promise<never>((_resolve, reject) => {
    timer = setTimeout(() => {
      void Promise.resolve(query.cancel()).catch(() => undefined);
      reject(new Error(`${what} took longer than ${ms} ms`));
    }, ms);
  });
  try {
    return await Promise.race([query, expired]);
  } finally {
    clearTimeout(timer);
    query.catch(() => undefined);
  }
}

/** Takes or renews the lease; `timeoutMs` bounds the statement (bounded). */
export async function acquireLease(sql: Sql, name: string, holder: string, ttlMs: number, instance?: LeaseInstance, timeoutMs?: number): Promise<LeaseTerm> {
  const id = instance?.id ?? null;
  const sameTerm = sql`leases.holder = EXCLUDED.holder AND leases.instance IS NOT DISTINCT FROM EXCLUDED.instance AND leases.expires_at >= now()`;
  const rows = await bounded(sql<{ holder: string; epoch: string; instance: string | null }[]>`
    INSERT INTO leases (name, holder, expires_at, epoch, term_started_at, instance)
    VALUES (${name}, ${holder}, now() + make_interval(secs => ${ttlMs / 1000}), 1, now(), ${id})
    ON CONFLICT (name) DO UPDATE SET
      holder = EXCLUDED.holder,
      instance = EXCLUDED.instance,
      expires_at = EXCLUDED.expires_at,
      epoch = CASE WHEN ${sameTerm} THEN leases.epoch ELSE leases.epoch + 1 END,
      term_started_at = CASE WHEN ${sameTerm} THEN leases.term_started_at ELSE now() END
    WHERE leases.expires_at < now()
      OR (leases.holder = EXCLUDED.holder AND (leases.instance IS NOT DISTINCT FROM EXCLUDED.instance OR ${instance?.fresh ?? false}))
    RETURNING holder, epoch, instance`, timeoutMs, 'the lease statement');
  const row = rows[0];
  return row !== undefined && row.holder === holder && row.instance === id ? { held: true, epoch: Number(row.epoch) } : { held: false, epoch: 0 };
}

/** Ends `holder`'s term now and tells the other replicas; `timeoutMs` bounds the statement (bounded). */
export async function releaseLease(sql: Sql, name: string, holder: string, timeoutMs?: number): Promise<void> {
  const rows = await bounded(sql`
    UPDATE leases SET expires_at = now() - interval '1 millisecond' WHERE name = ${name} AND holder = ${holder} RETURNING name`, timeoutMs, 'the lease release');
  if (rows.length > 0) await bounded(sql`SELECT pg_notify(${LEASE_RELEASED_CHANNEL}, ${name})`, timeoutMs, 'the lease release');
}

export interface LeaseRow {
  readonly holder: string;
  readonly epoch: number;
  readonly expiresAt: Date;
  /** When the current term began. */
  readonly termStartedAt: Date;
  /** False once `expires_at` has passed, by the database's clock. */
  readonly live: boolean;
}

/**
 * The condition a leader-only write adds to its WHERE clause: the term (holder and epoch) still
 * holds the leader lease, by the database's clock. A write fenced so does nothing once another
 * term began, however long its writer stalled after it last checked that it leads.
 */
export function termHolds(sql: Sql, term: { readonly holder: string; readonly epoch: number }) {
  // The statement's time, not the transaction's: a statement after a lock wait judges the lease now.
  return sql`EXISTS (SELECT 1 FROM leases WHERE name = ${LEADER_LEASE} AND holder = ${term.holder} AND epoch = ${term.epoch} AND expires_at > statement_timestamp())`;
}

/** Raised when a fenced write found the term gone: another replica leads and will carry on. */
export class LeaseLost extends Error {}

/**
 * In a transaction, before its writes: throws LeaseLost unless the term still holds the leader
 * lease, and keeps it held until the transaction ends. The lease row is share-locked, so no other
 * replica takes the lease over (nor does this one renew it) before this transaction commits or
 * rolls back: a writer that stalls between this check and its COMMIT cannot write beside a new
 * term. A stall holds the takeover back for at most the idle transaction timeout (store/db.ts).
 */
export async function assertTerm(sql: Sql, term: { readonly holder: string; readonly epoch: number }): Promise<void> {
  const rows = await sql`
    SELECT 1 FROM leases
    WHERE name = ${LEADER_LEASE} AND holder = ${term.holder} AND epoch = ${term.epoch} AND expires_at > statement_timestamp()
    FOR SHARE`;
  if (rows.length === 0) throw new LeaseLost('leader lease lost');
}

export async function readLease(sql: Sql, name: string): Promise<LeaseRow | null> {
  const [row] = await sql<{ holder: string; epoch: string; expires_at: Date; term_started_at: Date; live: boolean }[]>`
    SELECT holder, epoch, expires_at, term_started_at, expires_at > now() AS live FROM leases WHERE name = ${name}`;
  return row
    ? { holder: row.holder, epoch: Number(row.epoch), expiresAt: row.expires_at, termStartedAt: row.term_started_at, live: row.live }
    : null;
}
