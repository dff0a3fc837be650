/** Orgs and their API keys. Keys are stored as sha256 hashes only. */
import { newId } from '../../../shared/src/ids.js';
import type { Sql } from './db.js';

/**
 * The id of the org named `name`, created on first sight. An existing org is only read: an upsert
 * would write (and lock) the org's row on every request of a JWT caller.
 */
export async function ensureOrg(sql: Sql, name: string): Promise<string> {
  for (;;) {
    const [found] = await sql<{ id: string }[]>`SELECT id FROM orgs WHERE name = ${name}`;
    if (found) return found.id;
    const [created] = await sql<{ id: string }[]>`
      INSERT INTO orgs (id, name) VALUES (${newId('org')}, ${name}) ON CONFLICT (name) DO NOTHING RETURNING id`;
    if (created) return created.id;
    // Another request created it between the two statements: read it.
  }
}

export interface ApiKeyRow {
  id: string;
  org_id: string;
  name: string | null;
  prefix: string | null;
  created_at: Date;
  last_used_at: Date | null;
}

export async function insertApiKey(sql: Sql, orgId: string, tokenHash: string, shown: { name: string | null; prefix: string }): Promise<ApiKeyRow> {
  const [row] = await sql<ApiKeyRow[]>`
    INSERT INTO api_keys (id, org_id, token_hash, name, prefix) VALUES (${newId('apiKey')}, ${orgId}, ${tokenHash}, ${shown.name}, ${shown.prefix})
    RETURNING id, org_id, name, prefix, created_at, last_used_at`;
  return row!;
}

/** The org's live keys, oldest first. */
export async function listApiKeys(sql: Sql, orgId: string): Promise<ApiKeyRow[]> {
  return sql<ApiKeyRow[]>`
    SELECT id, org_id, name, prefix, created_at, last_used_at FROM api_keys
    WHERE org_id = ${orgId} AND revoked_at IS NULL ORDER BY created_at, id`;
}

/** Revokes a live key of the org; false when there is none with that id. */
/** Revokes the key; answers its token hash, or null when the org has no such live key. */
export async function revokeApiKey(sql: Sql, orgId: string, id: string): Promise<string | null> {
  const rows = await sql<Array<{ token_hash: string }>>`
    UPDATE api_keys SET revoked_at = now() WHERE id = ${id} AND org_id = ${orgId} AND revoked_at IS NULL RETURNING token_hash`;
  return rows[0]?.token_hash ?? null;
}

/** Records that the key was used (callers limit how often). */
export async function touchApiKey(sql: Sql, tokenHash: string): Promise<void> {
  await sql`UPDATE api_keys SET last_used_at = now() WHERE token_hash = ${tokenHash}`;
}

export async function orgForKeyHash(sql: Sql, tokenHash: string): Promise<string | null> {
  const [row] = await sql<{ org_id: string }[]>`
    SELECT org_id FROM api_keys WHERE token_hash = ${tokenHash} AND revoked_at IS NULL`;
  return row?.org_id ?? null;
}
