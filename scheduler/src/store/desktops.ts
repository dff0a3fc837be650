/**
 * Desktop rows. Every lifecycle transition goes through `transition`, which bumps `generation`
 * and mints a new `current_generation_id` in the same statement, so no code path can change a
 * desktop's state without moving its fencing token.
 */
import { newId } from '../../../shared/src/ids.js';
import type { Sql } from './db.js';
import type { BillingMode, DesktopRow, DesktopState } from './rows.js';
import type { Tier } from '../../../shared/src/tiers.js';
import { DESKTOP_VIEW_COLUMNS, type DesktopView } from './desktop-reads.js';

export interface NewDesktop {
  orgId: string;
  tier: Tier;
  imageVersion: string;
  idleTimeoutSecs: number;
  billingMode: BillingMode;
  /** Sealed bound to the org (crypto/desktop-secrets.ts), as every new desktop's are. */
  envSealed: Buffer | null;
  setupScriptSealed: Buffer | null;
}

export async function insertDesktop(sql: Sql, d: NewDesktop): Promise<DesktopRow> {
  const [row] = await sql<DesktopRow[]>`
    INSERT INTO desktops (id, org_id, tier, state, image_version, generation, current_generation_id,
                          idle_timeout_secs, billing_mode, env_sealed, setup_script_sealed, secrets_bound)
    VALUES (${newId('desktop')}, ${d.orgId}, ${d.tier}, 'provisioning', ${d.imageVersion}, 0, ${newId('generation')},
            ${d.idleTimeoutSecs}, ${d.billingMode}, ${d.envSealed}, ${d.setupScriptSealed}, true)
    RETURNING *`;
  return row!;
}

/** The desktop with its host's status (`host_status`), as the API shows it. */
export async function getDesktop(sql: Sql, orgId: string, id: string): Promise<DesktopRow | null> {
  const [row] = await sql<DesktopRow[]>`
    SELECT d.*, h.status AS host_status FROM desktops d LEFT JOIN hosts h ON h.id = d.host_id
    WHERE d.id = ${id} AND d.org_id = ${orgId}`;
  return row ?? null;
}

/**
 * Channel on which a replica says that the host of a desktop recorded awake answered a guest call
 * with "not running" (payload: the desktop id). The leader's engine checks it with the host.
 */
export const GUEST_GONE_CHANNEL = 'canto_guest_gone';

export async function notifyGuestGone(sql: Sql, desktopId: string): Promise<void> {
  await sql`SELECT pg_notify(${GUEST_GONE_CHANNEL}, ${desktopId})`;
}

export async function getDesktopById(sql: Sql, id: string): Promise<DesktopRow | null> {
  const [row] = await sql<DesktopRow[]>`SELECT * FROM desktops WHERE id = ${id}`;
  return row ?? null;
}

export async function lockDesktop(sql: Sql, orgId: string, id: string): Promise<DesktopRow | null> {
  const [row] = await sql<DesktopRow[]>`SELECT * FROM desktops WHERE id = ${id} AND org_id = ${orgId} FOR UPDATE`;
  return row ?? null;
}

/**
 * A fingerprint of an org's desktop list: the number of rows and the sum of a 64-bit hash over
 * each row version's identity (the transaction that wrote it and its place in the table; every
 * insert and update writes a new version) and its host's status, the one column of another table
 * the list shows. Equal fingerprints mean the same list but for a 2^-64 coincidence of hashes;
 * a rewrite that moves rows (VACUUM FULL) only changes it.
 */
const ROW_VERSION = `hashtextextended(d.xmin::text || d.ctid::text || coalesce(h.status, ''), 0)`;

function fingerprintOf(n: number, sum: string | null): string {
  return `${n}:${sum ?? 0}`;
}

/** The list's fingerprint (see ROW_VERSION), computed by Postgres: no row leaves the database. */
export async function desktopListFingerprint(sql: Sql, orgId: string, state: DesktopState | null): Promise<string> {
  const [row] = await sql<Array<{ n: number; sum: string | null }>>`
    SELECT count(*)::int AS n, sum(${sql.unsafe(ROW_VERSION)})::text AS sum
    FROM desktops d LEFT JOIN hosts h ON h.id = d.host_id
    WHERE d.org_id = ${orgId} ${state ? sql`AND d.state = ${state}` : sql``}`;
  return fingerprintOf(row!.n, row!.sum);
}

/**
 * The org's desktops as the API lists them (with `state`, only those in it), oldest first, each
 * with its row version, and the fingerprint of those very rows, summed from the versions read
 * (the same exact integer sum Postgres makes): one statement, so one snapshot. A fingerprint read
 * by a statement of its own before the rows could describe an older list than they are, and that
 * older list can come back (a desktop created, then deleted): its fingerprint would then vouch
 * for rows that are no longer there. Window aggregates would give the same in the statement, at
 * half its cost again.
 */
export async function listDesktopViewsFingerprinted(
  sql: Sql, orgId: string, state: DesktopState | null,
): Promise<{ views: VersionedView[]; fingerprint: string }> {
  const rows = await sql<VersionedView[]>`
    SELECT ${sql.unsafe(DESKTOP_VIEW_COLUMNS)}, (${sql.unsafe(ROW_VERSION)})::text AS row_version
    FROM desktops d LEFT JOIN hosts h ON h.id = d.host_id
    WHERE d.org_id = ${orgId} ${state ? sql`AND d.state = ${state}` : sql``}
    ORDER BY d.created_at, d.id`;
  return { views: rows, fingerprint: fingerprintOfVersions(rows) };
}

/** A desktop as the list shows it, with the identity of the row version it was read from (ROW_VERSION). */
export type VersionedView = DesktopView & { row_version: string };

/**
 * The list's rows by identity only, in the list's order: each desktop's id and row version, and
 * the list's fingerprint, in one statement. A list that changed in a few rows is made again from
 * this and those rows alone (services/desktop-list.ts).
 */
export async function listDesktopVersions(
  sql: Sql, orgId: string, state: DesktopState | null,
): Promise<{ rows: Array<{ id: string; row_version: string }>; fingerprint: string }> {
  const rows = await sql<Array<{ id: string; row_version: string }>>`
    SELECT d.id, (${sql.unsafe(ROW_VERSION)})::text AS row_version
    FROM desktops d LEFT JOIN hosts h ON h.id = d.host_id
    WHERE d.org_id = ${orgId} ${state ? sql`AND d.state = ${state}` : sql``}
    ORDER BY d.created_at, d.id`;
  return { rows, fingerprint: fingerprintOfVersions(rows) };
}

/** The org's desktops `ids` as the list shows them, with their row versions; missing ones are left out. */
export async function desktopViewsVersioned(sql: Sql, orgId: string, ids: readonly string[]): Promise<VersionedView[]> {
  return sql<VersionedView[]>`
    SELECT ${sql.unsafe(DESKTOP_VIEW_COLUMNS)}, (${sql.unsafe(ROW_VERSION)})::text AS row_version
    FROM desktops d LEFT JOIN hosts h ON h.id = d.host_id
    WHERE d.org_id = ${orgId} AND d.id = ANY(${ids as string[]}::text[])`;
}

/** The fingerprint of rows read with their versions: what `desktopListFingerprint` computes in Postgres. */
function fingerprintOfVersions(rows: ReadonlyArray<{ row_version: string }>): string {
  let sum = 0n;
  for (const row of rows) sum += BigInt(row.row_version);
  return fingerprintOf(rows.length, rows.length === 0 ? null : sum.toString());
}

export async function setIdleTimeout(sql: Sql, orgId: string, id: string, secs: number): Promise<DesktopRow | null> {
  const [row] = await sql<DesktopRow[]>`
    UPDATE desktops SET idle_timeout_secs = ${secs} WHERE id = ${id} AND org_id = ${orgId}
    RETURNING *, (SELECT status FROM hosts WHERE hosts.id = desktops.host_id) AS host_status`;
  return row ?? null;
}

export interface TransitionExtras {
  hostId?: string;
  markWoken?: boolean;
  markCreatedEvent?: boolean;
  markDestroyed?: boolean;
  /** Only if the desktop is still at this generation (nothing else moved it meanwhile). */
  expectGeneration?: number;
  /** Clears the moving mark in the same statement (a move's commit). */
  clearMoving?: boolean;
}

/**
 * Moves a desktop from one of `from` to `to`, bumping its generation. Returns null (and changes
 * nothing) when the desktop is no longer in an expected state.
 */
export async function transition(
  sql: Sql,
  id: string,
  from: readonly DesktopState[],
  to: DesktopState,
  extras: TransitionExtras = {},
): Promise<DesktopRow | null> {
  const [row] = await sql<DesktopRow[]>`
    UPDATE desktops SET
      state = ${to},
      generation = generation + 1,
      current_generation_id = ${newId('generation')},
      host_id = COALESCE(${extras.hostId ?? null}, host_id),
      last_woken_at = CASE WHEN ${extras.markWoken ?? false} THEN now() ELSE last_woken_at END,
      first_woken_at = CASE WHEN ${extras.markWoken ?? false} THEN COALESCE(first_woken_at, now()) ELSE first_woken_at END,
      created_event_at = CASE WHEN ${extras.markCreatedEvent ?? false} THEN COALESCE(created_event_at, now()) ELSE created_event_at END,
      destroyed_at = CASE WHEN ${extras.markDestroyed ?? false} THEN now() ELSE destroyed_at END,
      env_sealed = CASE WHEN ${extras.markDestroyed ?? false} THEN NULL ELSE env_sealed END,
      setup_script_sealed = CASE WHEN ${extras.markDestroyed ?? false} THEN NULL ELSE setup_script_sealed END,
      moving_operation_id = CASE WHEN ${extras.clearMoving ?? false} THEN NULL ELSE moving_operation_id END
    WHERE id = ${id} AND state IN ${sql(from as DesktopState[])}
      ${extras.expectGeneration === undefined ? sql`` : sql`AND generation = ${extras.expectGeneration}`}
    RETURNING *`;
  return row ?? null;
}

/**
 * Records where a desktop's disk lives, once; returns false when it was already placed, or is no
 * longer waiting for a place (destroyed meanwhile).
 */
export async function setPlacement(sql: Sql, id: string, hostId: string): Promise<boolean> {
  const rows = await sql`UPDATE desktops SET host_id = ${hostId} WHERE id = ${id} AND host_id IS NULL AND state IN ('provisioning', 'waking') RETURNING id`;
  return rows.length === 1;
}

/** Of `ids`, the desktops that have a host, and that host. */
export async function placedDesktops(sql: Sql, ids: readonly string[]): Promise<Map<string, string>> {
  if (ids.length === 0) return new Map();
  const rows = await sql<{ id: string; host_id: string }[]>`
    SELECT id, host_id FROM desktops WHERE id = ANY(${ids as string[]}::text[]) AND host_id IS NOT NULL`;
  return new Map(rows.map((r) => [r.id, r.host_id]));
}

export async function idempotentDesktop(sql: Sql, orgId: string, key: string): Promise<string | null> {
  const [row] = await sql<{ desktop_id: string }[]>`
    SELECT desktop_id FROM desktop_idempotency WHERE org_id = ${orgId} AND key = ${key}`;
  return row?.desktop_id ?? null;
}

/** Claims an idempotency key for a desktop; false when another request claimed it first. */
export async function claimDesktopKey(sql: Sql, orgId: string, key: string, desktopId: string): Promise<boolean> {
  const rows = await sql`
    INSERT INTO desktop_idempotency (org_id, key, desktop_id) VALUES (${orgId}, ${key}, ${desktopId})
    ON CONFLICT DO NOTHING RETURNING key`;
  return rows.length === 1;
}

/** How long after an idle timeout's operation failed the desktop is left before another is tried. */
export const IDLE_RETRY_SECS = 60;

/**
 * Desktops whose idle timeout has elapsed: awake ones, counted from the last wake, and ephemeral
 * forks that are hibernated, counted from their last wake or, never woken, their creation. One
 * whose idle operation failed within `IDLE_RETRY_SECS` waits: a hibernate that fails at once
 * (a dump refused, a host out of reach) would otherwise be asked again at every sweep, a new
 * operation and two generations a second, for as long as the cause lasts. One with an operation
 * open is left out too: the request would be refused, and a batch of them (destroys waiting for
 * a silent host) kept every other desktop of the fleet from its idle timeout.
 */
export async function idleDesktops(sql: Sql, limit: number): Promise<DesktopRow[]> {
  return sql<DesktopRow[]>`
    SELECT * FROM desktops d
    WHERE idle_timeout_secs > 0 AND (
      (state = 'awake' AND last_woken_at + make_interval(secs => idle_timeout_secs) <= now())
      OR (ephemeral AND state = 'hibernated'
          AND COALESCE(last_woken_at, created_at) + make_interval(secs => idle_timeout_secs) <= now()))
      AND NOT EXISTS (
        SELECT 1 FROM operations o WHERE o.desktop_id = d.id AND o.reason = 'idle_timeout' AND o.state = 'failed'
          AND o.settled_at > now() - make_interval(secs => ${IDLE_RETRY_SECS}))
      AND NOT EXISTS (SELECT 1 FROM operations o WHERE o.desktop_id = d.id AND o.state IN ('pending', 'running'))
    ORDER BY COALESCE(last_woken_at, created_at) LIMIT ${limit}`;
}

/**
 * The forks of `source`, hibernated on its host at generation 1 (placed, never booted here):
 * tier, billing mode, image, idle timeout and the sealed first-boot settings are inherited, and
 * so is `first_woken_at`, because a fork's disk already carries its source's first boot.
 * Existing ids are skipped, so a re-driven fork inserts nothing twice.
 */
export async function insertForks(sql: Sql, sourceId: string, ids: readonly string[], ephemeral: boolean, ephemeralIdleSecs: number): Promise<DesktopRow[]> {
  const rows: DesktopRow[] = [];
  for (const id of ids) {
    const [row] = await sql<DesktopRow[]>`
      INSERT INTO desktops (id, org_id, tier, state, image_version, generation, current_generation_id, idle_timeout_secs,
                            billing_mode, host_id, env_sealed, setup_script_sealed, secrets_bound, created_event_at, first_woken_at,
                            ephemeral, forked_from)
      SELECT ${id}, org_id, tier, 'hibernated', image_version, 1, ${newId('generation')},
             ${ephemeral ? ephemeralIdleSecs : sql`idle_timeout_secs`}, billing_mode, host_id, env_sealed, setup_script_sealed, secrets_bound,
             now(), first_woken_at, ${ephemeral}, id
      FROM desktops WHERE id = ${sourceId}
      ON CONFLICT (id) DO NOTHING
      RETURNING *`;
    if (row) rows.push(row);
  }
  return rows;
}

/**
 * Desktops still waiting for a host: the oldest `perTier` of each tier, oldest first. Per tier,
 * because desktops of one tier that no host can take would otherwise fill every round, and newer
 * ones of a tier that fits would never be placed; within a tier the oldest go first, since one
 * that cannot be placed means none of its tier can.
 */
export async function provisioningDesktops(sql: Sql, perTier: number): Promise<DesktopRow[]> {
  return sql<DesktopRow[]>`
    SELECT d.* FROM (SELECT DISTINCT tier FROM desktops WHERE state = 'provisioning') t
    CROSS JOIN LATERAL (
      SELECT * FROM desktops WHERE state = 'provisioning' AND tier = t.tier ORDER BY created_at LIMIT ${perTier}
    ) d
    ORDER BY d.created_at`;
}

/**
 * The desktops the org holds and has asked for, counted under its row lock so that two creates or
 * forks at once cannot both pass a quota: every one not destroyed, and the forks that open fork
 * operations will add (their rows come when the fork runs; one that has begun may count twice,
 * which errs on the side of the quota).
 */
export async function heldByOrgLocked(tx: Sql, orgId: string): Promise<number> {
  // NO KEY UPDATE: it serializes the counts without conflicting with the KEY SHARE lock that a
  // desktop's insert takes on its org (FOR UPDATE would, and two creates would deadlock).
  await tx`SELECT 1 FROM orgs WHERE id = ${orgId} FOR NO KEY UPDATE`;
  const [row] = await tx<Array<{ n: number }>>`
    SELECT (SELECT count(*) FROM desktops WHERE org_id = ${orgId} AND state <> 'destroyed')::int
         + (SELECT coalesce(sum((params->>'count')::int), 0) FROM operations WHERE org_id = ${orgId} AND kind = 'fork' AND state IN ('pending', 'running'))::int AS n`;
  return row!.n;
}
