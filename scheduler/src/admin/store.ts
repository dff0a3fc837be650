/**
 * What the admin API reads and writes beyond the other stores: a host's desktops by state,
 * cordoning, removing a host's row, and orgs with their key and desktop counts.
 */
import { newId } from '../../../shared/src/ids.js';
import { inTransaction, type Sql } from '../store/db.js';
import type { HostRow } from '../store/rows.js';

export async function hostById(sql: Sql, id: string): Promise<HostRow | null> {
  const [row] = await sql<HostRow[]>`SELECT * FROM hosts WHERE id = ${id}`;
  return row ?? null;
}

/** Desktops not destroyed, by host and state (every host if `hostId` is not given). */
export async function desktopStatesByHost(sql: Sql, hostId?: string): Promise<Map<string, Map<string, number>>> {
  const rows = await sql<Array<{ host_id: string; state: string; n: number }>>`
    SELECT host_id, state, count(*)::int AS n FROM desktops
    WHERE host_id IS NOT NULL AND state <> 'destroyed' ${hostId === undefined ? sql`` : sql`AND host_id = ${hostId}`}
    GROUP BY host_id, state`;
  const byHost = new Map<string, Map<string, number>>();
  for (const r of rows) {
    const states = byHost.get(r.host_id) ?? new Map<string, number>();
    states.set(r.state, r.n);
    byHost.set(r.host_id, states);
  }
  return byHost;
}

/** False when there is no such host. */
export async function setHostCordoned(sql: Sql, id: string, cordoned: boolean): Promise<boolean> {
  const rows = await sql`UPDATE hosts SET cordoned = ${cordoned} WHERE id = ${id} RETURNING id`;
  return rows.length === 1;
}

export type RemoveHostOutcome =
  | { readonly removed: true }
  | { readonly removed: false; readonly why: 'not_found' | 'linked' }
  | { readonly removed: false; readonly why: 'holds_desktops'; readonly desktops: number };

/**
 * Deletes the host's row when it holds no desktop and its agent is gone: the row is locked
 * first, so a placement on it (whose foreign key check needs the row) waits and then fails
 * instead of landing on a host that no longer exists. Destroyed desktops keep no host: the
 * disk they had there is gone with them.
 */
export async function removeHost(sql: Sql, id: string, linked: () => boolean): Promise<RemoveHostOutcome> {
  return inTransaction(sql, async (tx) => {
    const [host] = await tx<Array<{ status: string }>>`SELECT status FROM hosts WHERE id = ${id} FOR UPDATE`;
    if (!host) return { removed: false, why: 'not_found' };
    const [held] = await tx<Array<{ n: number }>>`SELECT count(*)::int AS n FROM desktops WHERE host_id = ${id} AND state <> 'destroyed'`;
    if (held!.n > 0) return { removed: false, why: 'holds_desktops', desktops: held!.n };
    if (host.status === 'ready' || linked()) return { removed: false, why: 'linked' };
    await tx`UPDATE desktops SET host_id = NULL WHERE host_id = ${id} AND state = 'destroyed'`;
    await tx`DELETE FROM hosts WHERE id = ${id}`;
    return { removed: true };
  });
}

export interface OrgSummaryRow {
  id: string;
  name: string;
  created_at: Date;
  key_count: number;
  desktop_count: number;
}

export async function listOrgSummaries(sql: Sql, id?: string): Promise<OrgSummaryRow[]> {
  return sql<OrgSummaryRow[]>`
    SELECT o.id, o.name, o.created_at,
           (SELECT count(*)::int FROM api_keys k WHERE k.org_id = o.id AND k.revoked_at IS NULL) AS key_count,
           (SELECT count(*)::int FROM desktops d WHERE d.org_id = o.id AND d.state <> 'destroyed') AS desktop_count
    FROM orgs o ${id === undefined ? sql`` : sql`WHERE o.id = ${id}`}
    ORDER BY o.created_at, o.id`;
}

/** Creates the org; null when one with this name exists. */
export async function insertOrg(sql: Sql, name: string): Promise<string | null> {
  const [row] = await sql<Array<{ id: string }>>`
    INSERT INTO orgs (id, name) VALUES (${newId('org')}, ${name}) ON CONFLICT (name) DO NOTHING RETURNING id`;
  return row?.id ?? null;
}

export async function orgExists(sql: Sql, id: string): Promise<boolean> {
  const rows = await sql`SELECT 1 FROM orgs WHERE id = ${id}`;
  return rows.length === 1;
}

/** A desktop a lost host still holds, with the kind of its open operation (null: none). */
export interface LostDesktop {
  id: string;
  org_id: string;
  open_kind: string | null;
}

/**
 * Declares the host lost (once: the first time stays) and cordons it, unless it is up: ready, or
 * heard from within `downMs` (an agent that came back and has not fenced yet reads down, but its
 * hello made it heard; the check and the mark are one statement, so a hello cannot slip between).
 * Answers its desktops, `up` when it is up, or null when there is no such host.
 */
export async function markHostLost(sql: Sql, id: string, downMs: number): Promise<{ lostAt: Date; desktops: LostDesktop[] } | 'up' | null> {
  const [host] = await sql<Array<{ lost_at: Date }>>`
    UPDATE hosts SET lost_at = COALESCE(lost_at, now()), cordoned = true
    WHERE id = ${id} AND (lost_at IS NOT NULL OR (status <> 'ready' AND last_seen_at < now() - make_interval(secs => ${downMs / 1000})))
    RETURNING lost_at`;
  if (!host) return (await sql`SELECT 1 FROM hosts WHERE id = ${id}`).length === 1 ? 'up' : null;
  const desktops = await sql<LostDesktop[]>`
    SELECT d.id, d.org_id, (SELECT o.kind FROM operations o WHERE o.desktop_id = d.id AND o.state IN ('pending', 'running') LIMIT 1) AS open_kind
    FROM desktops d WHERE d.host_id = ${id} AND d.state <> 'destroyed' ORDER BY d.created_at`;
  return { lostAt: host.lost_at, desktops };
}

/**
 * Forgets the key a host registered with, so its next hello records the key it sends; not while
 * it is ready (its agent, holding the key, is linked: nothing is lost, and forgetting would let
 * another claim the id). Answers `up`, or null when there is no such host.
 */
export async function resetHostKey(sql: Sql, id: string): Promise<'reset' | 'up' | null> {
  const [row] = await sql<Array<{ ready: boolean }>>`
    UPDATE hosts SET host_key_hash = CASE WHEN status = 'ready' THEN host_key_hash END WHERE id = ${id} RETURNING status = 'ready' AS ready`;
  if (!row) return null;
  return row.ready ? 'up' : 'reset';
}
