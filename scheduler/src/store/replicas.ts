/** Scheduler replicas: one row each, refreshed while the replica runs (fleet/registry.ts). */
import type { Sql } from './db.js';

export interface ReplicaRow {
  id: string;
  url: string;
  version: string;
  settings: Record<string, string | number | null>;
  started_at: Date;
  last_seen_at: Date;
  /** Hosts whose agent links to this replica were up at its last refresh; null from a replica that does not say (an older version). */
  linked_hosts: string[] | null;
}

export interface ReplicaRecord {
  readonly id: string;
  readonly url: string;
  readonly version: string;
  readonly settings: Readonly<Record<string, string | number | null>>;
}

/**
 * Registers a replica, or refreshes it; a restarted replica of the same id starts again, and so
 * does one whose row aged out (not refreshed for `liveMs`: it could not reach the database, so
 * it recorded no heartbeat either). `started_at` is since when it has recorded without a gap.
 */
export async function upsertReplica(sql: Sql, r: ReplicaRecord, starting: boolean, liveMs: number, linkedHosts: readonly string[]): Promise<void> {
  await sql`
    INSERT INTO replicas (id, url, version, settings, linked_hosts)
    VALUES (${r.id}, ${r.url}, ${r.version}, ${sql.json(r.settings as never)}, ${sql.array([...linkedHosts])}::text[])
    ON CONFLICT (id) DO UPDATE SET url = EXCLUDED.url, version = EXCLUDED.version, settings = EXCLUDED.settings,
      linked_hosts = EXCLUDED.linked_hosts, last_seen_at = now(),
      started_at = CASE WHEN ${starting} OR replicas.last_seen_at < now() - make_interval(secs => ${liveMs / 1000}) THEN now() ELSE replicas.started_at END`;
}

/** Replicas refreshed within `liveMs`, oldest first. */
export async function liveReplicas(sql: Sql, liveMs: number): Promise<ReplicaRow[]> {
  return sql<ReplicaRow[]>`
    SELECT * FROM replicas WHERE last_seen_at > now() - make_interval(secs => ${liveMs / 1000}) ORDER BY started_at, id`;
}

export async function allReplicas(sql: Sql): Promise<ReplicaRow[]> {
  return sql<ReplicaRow[]>`SELECT * FROM replicas ORDER BY started_at, id`;
}

export async function removeReplica(sql: Sql, id: string): Promise<void> {
  await sql`DELETE FROM replicas WHERE id = ${id}`;
}

/** Rows of replicas not seen for `staleMs`: gone without saying goodbye (a crash). */
export async function pruneReplicas(sql: Sql, staleMs: number): Promise<number> {
  const rows = await sql`DELETE FROM replicas WHERE last_seen_at < now() - make_interval(secs => ${staleMs / 1000}) RETURNING id`;
  return rows.length;
}
