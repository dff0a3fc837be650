/**
 * API keys: `svc_sk_` followed by 256 random bits (base64url). Only the sha256 of a key is
 * stored; the key itself is shown once, when created. Lookups are cached per replica and dropped
 * when the key's row changes (store/notified-cache.ts), so revoking a key takes effect at once.
 */
import { randomBytes } from 'node:crypto';
import type { Sql } from '../store/db.js';
import { ensureOrg, insertApiKey, orgForKeyHash } from '../store/orgs.js';
import { hashToken } from '../crypto/secret-box.js';
import type { NotifiedCache } from '../store/notified-cache.js';

export const API_KEY_PREFIX = 'svc_sk_';

export async function createApiKey(sql: Sql, orgName: string): Promise<{ orgId: string; key: string }> {
  const orgId = await ensureOrg(sql, orgName);
  const key = API_KEY_PREFIX + randomBytes(32).toString('base64url');
  await insertApiKey(sql, orgId, hashToken(key));
  return { orgId, key };
}

/** The org of a live API key, through `cache`, which is keyed by the key's hash. */
export async function orgForApiKey(sql: Sql, key: string, cache: NotifiedCache<string>): Promise<string | null> {
  if (!key.startsWith(API_KEY_PREFIX) || key.length > 200) return null;
  const hash = hashToken(key);
  return cache.get(hash, () => orgForKeyHash(sql, hash), () => true);
}
