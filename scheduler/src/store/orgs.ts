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

export async function insertApiKey(sql: Sql, orgId: string, tokenHash: string): Promise<string> {
  const id = newId('apiKey');
  await sql`INSERT INTO api_keys (id, org_id, token_hash) VALUES (${id}, ${orgId}, ${tokenHash})`;
  return id;
}

export async function orgForKeyHash(sql: Sql, tokenHash: string): Promise<string | null> {
  const [row] = await sql<{ org_id: string }[]>`
    SELECT org_id FROM api_keys WHERE token_hash = ${tokenHash} AND revoked_at IS NULL`;
  return row?.org_id ?? null;
}
