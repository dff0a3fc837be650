/**
 * Named leases in PostgreSQL: a row per lease, held by one replica until `expires_at`. A lease
 * row (rather than a session advisory lock) survives postgres.js reconnecting underneath us: a
 * silently re-established session would have lost an advisory lock without anyone noticing.
 */
import type { Sql } from './db.js';

/** Takes or renews the lease; true when `holder` holds it afterwards. */
export async function acquireLease(sql: Sql, name: string, holder: string, ttlMs: number): Promise<boolean> {
  const rows = await sql<{ holder: string }[]>`
    INSERT INTO leases (name, holder, expires_at) VALUES (${name}, ${holder}, now() + make_interval(secs => ${ttlMs / 1000}))
    ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
      WHERE leases.holder = EXCLUDED.holder OR leases.expires_at < now()
    RETURNING holder`;
  return rows.length === 1 && rows[0]!.holder === holder;
}

export async function releaseLease(sql: Sql, name: string, holder: string): Promise<void> {
  await sql`DELETE FROM leases WHERE name = ${name} AND holder = ${holder}`;
}
