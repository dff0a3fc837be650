/**
 * Verification of JWT access tokens issued by an external identity provider (docs/api.md §5).
 *
 * The provider publishes its public keys as a JWKS; jose fetches and caches it (10 min max age,
 * refetching at most every 30 s when a token names an unknown `kid`, so key rotation is picked up
 * without letting random `kid`s trigger a fetch per request).
 *
 * The point of this module is telling two failures apart, because they map to different answers:
 * a token that fails verification is the caller's problem (401), while keys that cannot be
 * obtained are ours (503, retryable). jose resolves the key in the middle of `jwtVerify`, so the
 * key lookup is wrapped: everything that goes wrong *while obtaining the key set* (connection
 * refused, DNS failure, timeout, non-200 answer, body that is not a JWKS, a key in the set that
 * cannot be imported) becomes `IdentityProviderUnavailable`, while "the set was fetched but no key
 * matches this token" stays a verification failure. Every other jose error comes from the token
 * itself (malformed, disallowed algorithm, bad signature, expired, wrong issuer or audience) and
 * yields `{ ok: false }`.
 *
 * Only asymmetric algorithms are accepted: with a symmetric one (HS*), anything able to read the
 * public key set could mint tokens, and `none` is never acceptable. The algorithm is checked
 * before any key is fetched, so such tokens are refused even while the provider is down.
 */
import {
  createRemoteJWKSet,
  errors,
  jwtVerify,
  type JWSHeaderParameters,
  type FlattenedJWSInput,
  type JWTPayload,
  type JWTVerifyOptions,
  type CryptoKey,
} from 'jose';

export interface JwtConfig {
  /** URL of the provider's JSON Web Key Set. */
  jwksUrl: string;
  /** Expected `iss` claim, compared exactly. */
  issuer: string;
  /** Expected `aud` claim (a token whose `aud` array contains it is accepted). */
  audience: string;
  /**
   * Name of the top-level claim holding the org id. Taken literally, with no dot-path splitting,
   * because namespaced claims such as `https://example.com/org_id` contain dots.
   */
  orgClaim: string;
  /** Deadline for one JWKS fetch in milliseconds. Default 5000. */
  timeoutMs?: number;
}

/** The identity provider's key set could not be obtained; the request should get a 503. */
export class IdentityProviderUnavailable extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'IdentityProviderUnavailable';
  }
}

/** The longest org name (the admin API's limit too). */
const MAX_ORG_NAME = 200;

export type JwtVerification = { ok: true; org: string; subject: string | null } | { ok: false; reason: string };

export interface JwtVerifier {
  /** Resolves `{ok: false}` for a bad token; rejects with `IdentityProviderUnavailable` when keys cannot be fetched. */
  verify(token: string): Promise<JwtVerification>;
}

/** Asymmetric JWS algorithms only (no HS*, no `none`). */
export const ALLOWED_ALGORITHMS = [
  'RS256', 'RS384', 'RS512',
  'PS256', 'PS384', 'PS512',
  'ES256', 'ES384', 'ES512',
  'EdDSA', 'Ed25519',
];

const DEFAULT_TIMEOUT_MS = 5000;
/** Tolerated clock difference with the provider for `exp`/`nbf`, in seconds. */
const CLOCK_TOLERANCE_SECONDS = 30;
/**
 * Real access tokens are a few KiB at most; refusing huge ones early avoids parsing megabytes of
 * base64 from an unauthenticated caller.
 */
const MAX_TOKEN_LENGTH = 16 * 1024;

const JWT_SHAPE = /^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$/;

/**
 * True when `token` has the shape of a compact JWS (three base64url segments), so the auth layer
 * can send it to the JWT verifier rather than the API-key lookup. The signature segment may be
 * empty so that `alg: none` tokens reach the verifier and are refused there with a clear reason.
 */
export function looksLikeJwt(token: string): boolean {
  return token.length <= MAX_TOKEN_LENGTH && JWT_SHAPE.test(token);
}

type KeyResolver = (header: JWSHeaderParameters, token: FlattenedJWSInput) => Promise<CryptoKey>;

export function createJwtVerifier(config: JwtConfig): JwtVerifier {
  const remote = createRemoteJWKSet(new URL(config.jwksUrl), {
    timeoutDuration: config.timeoutMs ?? DEFAULT_TIMEOUT_MS,
  });

  // jose passes errors thrown by the key resolver through `jwtVerify` unchanged, so throwing
  // IdentityProviderUnavailable here is how it reaches the caller intact.
  const resolveKey: KeyResolver = async (header, token) => {
    try {
      return await remote(header, token);
    } catch (err) {
      if (err instanceof errors.JWKSNoMatchingKey || err instanceof errors.JWKSMultipleMatchingKeys) throw err;
      throw new IdentityProviderUnavailable(`identity provider keys unavailable: ${describeError(err)}`, { cause: err });
    }
  };

  const options: JWTVerifyOptions = {
    issuer: config.issuer,
    audience: config.audience,
    algorithms: ALLOWED_ALGORITHMS,
    clockTolerance: CLOCK_TOLERANCE_SECONDS,
    // A token without `exp` would be valid forever; access tokens always carry one.
    requiredClaims: ['exp'],
  };

  async function verifyPayload(token: string): Promise<JWTPayload> {
    try {
      return (await jwtVerify(token, resolveKey, options)).payload;
    } catch (err) {
      // Without a `kid`, several keys of the right type may match (e.g. during rotation). jose
      // leaves the choice to us: try each candidate and accept the first that verifies.
      if (!(err instanceof errors.JWKSMultipleMatchingKeys)) throw err;
      let lastError: unknown = err;
      for await (const key of err) {
        try {
          return (await jwtVerify(token, key, options)).payload;
        } catch (candidateError) {
          lastError = candidateError;
        }
      }
      throw lastError;
    }
  }

  return {
    async verify(token) {
      if (token.length > MAX_TOKEN_LENGTH) return { ok: false, reason: 'token too long' };
      let payload: JWTPayload;
      try {
        payload = await verifyPayload(token);
      } catch (err) {
        if (err instanceof IdentityProviderUnavailable) throw err;
        if (err instanceof errors.JOSEError) return { ok: false, reason: describeError(err) };
        // Not a jose error and not from the key fetch: a bug, not a bad token. Let it be a 500.
        throw err;
      }
      const org = payload[config.orgClaim];
      if (typeof org !== 'string' || org.length === 0) {
        return { ok: false, reason: `claim "${config.orgClaim}" missing or not a non-empty string` };
      }
      // The org is created on first sight: a claim is held to what an org's name may be, so a
      // token cannot make an org of a megabyte's name, or one whose name breaks a log line or a table.
      // As an org's name is held by the admin API: no space at either end either (`acme ` would be
      // another org than `acme`, one that looks the same).
      if (org.length > MAX_ORG_NAME || /\p{Cc}/u.test(org) || /^\s|\s$/u.test(org)) {
        return { ok: false, reason: `claim "${config.orgClaim}" is longer than ${MAX_ORG_NAME} characters, holds control characters or starts or ends with a space` };
      }
      return { ok: true, org, subject: typeof payload.sub === 'string' ? payload.sub : null };
    },
  };
}

function describeError(err: unknown): string {
  if (err instanceof errors.JOSEError) return `${err.code}: ${err.message}`;
  if (err instanceof Error) {
    // undici reports "fetch failed" and hides the useful part (ECONNREFUSED, ENOTFOUND) in `cause`.
    const cause = err.cause instanceof Error ? ` (${err.cause.message})` : '';
    return `${err.message}${cause}`;
  }
  return String(err);
}
