/**
 * The admin API's credential: one bearer token per deployment (`CANTO_ADMIN_TOKEN`), the same on
 * every replica. Org API keys and JWTs mean nothing here, so no org's credential ever reaches the
 * fleet. The presented token is compared by its SHA-256 digest in constant time: the digests have
 * one length whatever was sent, so neither the comparison nor its length check tells a guess how
 * close it came. A replica started without a token has the admin API off (503), which says what
 * to do where a 401 would send the operator looking for a token that does not exist.
 */
import { hashToken, safeEqualHex } from '../crypto/secret-box.js';
import { errors } from '../errors.js';

/** Returns a check that throws the admin API's 401 or 503 unless `authorization` carries the token. */
export function createAdminTokenCheck(token: string | null): (authorization: string | undefined) => void {
  const expected = token === null ? null : hashToken(token);
  return (authorization) => {
    if (expected === null) throw errors.adminApiOff();
    const match = typeof authorization === 'string' ? /^Bearer ([\x21-\x7e]+)$/i.exec(authorization.trim()) : null;
    if (!match || !safeEqualHex(hashToken(match[1]!), expected)) throw errors.unauthorized();
  };
}
