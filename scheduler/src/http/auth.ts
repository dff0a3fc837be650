/**
 * Bearer authentication (docs/api.md §5): an API key `svc_sk_…` or a JWT from the configured identity
 * provider. Either resolves the caller's org; everything else is 401. An unreachable identity
 * provider is 503, so clients retry instead of discarding a valid token.
 */
import type { FastifyRequest } from 'fastify';
import type { Sql } from '../store/db.js';
import { ensureOrg } from '../store/orgs.js';
import { orgForApiKey, API_KEY_PREFIX } from '../services/keys.js';
import { errors } from '../errors.js';
import type { NotifiedCache } from '../store/notified-cache.js';
import { IdentityProviderUnavailable, looksLikeJwt, type createJwtVerifier } from '../auth/jwt-verifier.js';

export type JwtVerifier = ReturnType<typeof createJwtVerifier>;

export interface AuthCaches {
  /** Org ids by API key hash. */
  readonly keys: NotifiedCache<string>;
  /** Org ids by the org name a JWT carries. */
  readonly orgs: NotifiedCache<string>;
}

/** `keyUsed` hears every request an API key authenticated (it records when keys were last used). */
export function createAuthenticator(sql: Sql, jwt: JwtVerifier | null, caches: AuthCaches, keyUsed: (key: string) => void = () => {}) {
  return async function authenticate(request: FastifyRequest): Promise<string> {
    const header = request.headers.authorization;
    const match = typeof header === 'string' ? /^Bearer ([\x21-\x7e]+)$/i.exec(header.trim()) : null;
    if (!match) throw errors.unauthorized();
    const credential = match[1]!;
    if (credential.startsWith(API_KEY_PREFIX)) {
      const orgId = await orgForApiKey(sql, credential, caches.keys);
      if (!orgId) throw errors.unauthorized();
      keyUsed(credential);
      return orgId;
    }
    if (jwt && looksLikeJwt(credential)) {
      let verdict;
      try {
        verdict = await jwt.verify(credential);
      } catch (err) {
        if (err instanceof IdentityProviderUnavailable) throw errors.identityProviderUnavailable();
        throw err;
      }
      if (!verdict.ok) throw errors.unauthorized();
      const org = verdict.org;
      // ensureOrg never answers null, so neither does the cache in front of it.
      return (await caches.orgs.get(org, () => ensureOrg(sql, org), () => true))!;
    }
    throw errors.unauthorized();
  };
}
