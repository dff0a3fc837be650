/**
 * API keys: `svc_sk_` followed by 256 random bits (base64url). Only the sha256 of a key is
 * stored, with its first characters (`prefix`) so a person can tell keys apart in a list; the key
 * itself is shown once, when created. Lookups are cached per replica and dropped when the key's
 * row changes (store/notified-cache.ts), so revoking a key takes effect at once on every replica.
 *
 * Any credential of an org may create, list and revoke the org's keys (docs/api.md §4.10 names a
 * dashboard session; an API key or a JWT is what reaches this API). A key may revoke itself.
 */
import { randomBytes } from 'node:crypto';
import type { Sql } from '../store/db.js';
import { ensureOrg, insertApiKey, listApiKeys, orgForKeyHash, revokeApiKey, touchApiKey, type ApiKeyRow } from '../store/orgs.js';
import { hashToken } from '../crypto/secret-box.js';
import type { NotifiedCache } from '../store/notified-cache.js';
import { errors } from '../errors.js';

export const API_KEY_PREFIX = 'svc_sk_';
/** How much of a key is kept in the clear: the type prefix and five characters (30 bits). */
const SHOWN_CHARS = API_KEY_PREFIX.length + 5;
/** `last_used_at` is written at most this often per key and replica. */
export const LAST_USED_PRECISION_MS = 60_000;

export interface ApiKeyJson {
  id: string;
  name: string | null;
  prefix: string | null;
  created_at: string;
  last_used_at: string | null;
}

function mintKey(): { key: string; hash: string; prefix: string } {
  const key = API_KEY_PREFIX + randomBytes(32).toString('base64url');
  return { key, hash: hashToken(key), prefix: key.slice(0, SHOWN_CHARS) };
}

/** A key for the org named `orgName` (created if new): what `canto keys create` and `canto up` use. */
export async function createApiKey(sql: Sql, orgName: string, name: string | null = null): Promise<{ orgId: string; key: string }> {
  const orgId = await ensureOrg(sql, orgName);
  const minted = mintKey();
  await insertApiKey(sql, orgId, minted.hash, { name, prefix: minted.prefix });
  return { orgId, key: minted.key };
}

/** The org of a live API key, through `cache`, which is keyed by the key's hash. */
export async function orgForApiKey(sql: Sql, key: string, cache: NotifiedCache<string>): Promise<string | null> {
  if (!key.startsWith(API_KEY_PREFIX) || key.length > 200) return null;
  const hash = hashToken(key);
  return cache.get(hash, () => orgForKeyHash(sql, hash), () => true);
}

function toJson(row: ApiKeyRow): ApiKeyJson {
  return {
    id: row.id,
    name: row.name,
    prefix: row.prefix,
    created_at: row.created_at.toISOString(),
    last_used_at: row.last_used_at ? row.last_used_at.toISOString() : null,
  };
}

export class KeyService {
  /** When this replica last wrote `last_used_at`, by key hash. */
  private readonly touched = new Map<string, number>();

  /**
   * `cache`: this replica's key lookups (orgForApiKey). A revoke drops its key there at once:
   * the other replicas hear of it by notification, but the one that revoked it must not answer
   * with the key even for the moment its own notification takes.
   */
  constructor(
    private readonly sql: Sql,
    private readonly cache: NotifiedCache<string> | null = null,
  ) {}

  async create(orgId: string, name: string | null): Promise<ApiKeyJson & { key: string }> {
    const minted = mintKey();
    const row = await insertApiKey(this.sql, orgId, minted.hash, { name, prefix: minted.prefix });
    return { ...toJson(row), key: minted.key };
  }

  async list(orgId: string): Promise<ApiKeyJson[]> {
    return (await listApiKeys(this.sql, orgId)).map(toJson);
  }

  async revoke(orgId: string, id: string): Promise<void> {
    const hash = await revokeApiKey(this.sql, orgId, id);
    if (hash === null) throw errors.keyNotFound();
    this.cache?.evict(hash);
  }

  /** Records a use of the key, at most once a minute per replica; never fails the request. */
  used(key: string): void {
    const hash = hashToken(key);
    const now = Date.now();
    if (now - (this.touched.get(hash) ?? 0) < LAST_USED_PRECISION_MS) return;
    if (this.touched.size >= 10_000) this.touched.clear();
    this.touched.set(hash, now);
    touchApiKey(this.sql, hash).catch(() => this.touched.delete(hash));
  }
}
