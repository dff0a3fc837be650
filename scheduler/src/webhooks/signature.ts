/**
 * Webhook secrets and signatures (docs/api.md §5, 6). Every delivery attempt carries
 * `Svc-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>`, the scheme
 * Stripe popularised, so receivers can verify with code they already have. The timestamp is
 * signed with the body: a captured request cannot be replayed after the receiver's tolerance
 * window (300 s by convention), and a retry is signed afresh with the time of that attempt.
 *
 * The secret is used as the HMAC key exactly as shown to the client, prefix included, so a
 * receiver never has to strip or decode anything.
 */
import { createHmac, randomBytes } from 'node:crypto';
import { safeEqualHex } from '../crypto/secret-box.js';

export const WEBHOOK_SECRET_PREFIX = 'svc_whsec_';
export const SIGNATURE_TOLERANCE_SECS = 300;

/** A new endpoint secret: the prefix and 256 random bits, base64url. */
export function newWebhookSecret(): string {
  return WEBHOOK_SECRET_PREFIX + randomBytes(32).toString('base64url');
}

/** Lowercase hex HMAC-SHA256 of `<t>.<body>` under `secret`. */
export function computeSignature(secret: string, timestamp: number, body: string | Buffer): string {
  return createHmac('sha256', secret).update(`${timestamp}.`).update(body).digest('hex');
}

/** The `Svc-Signature` header value for `body` sent at `timestamp` (Unix seconds). */
export function signatureHeader(secret: string, timestamp: number, body: string | Buffer): string {
  return `t=${timestamp},v1=${computeSignature(secret, timestamp, body)}`;
}

export interface VerifyOptions {
  /** Unix seconds; default now. */
  nowSecs?: number;
  /** How far `t` may be from now; default 300 s. */
  toleranceSecs?: number;
}

/**
 * Receiver-side verification, over the raw body before any JSON parsing: the header must carry
 * a timestamp within the tolerance and at least one `v1` that matches, compared in constant time.
 * Several `v1` values are allowed so a receiver can accept a delivery signed during a rotation.
 */
export function verifySignature(secret: string, body: string | Buffer, header: string, options: VerifyOptions = {}): boolean {
  let timestamp: number | null = null;
  const candidates: string[] = [];
  for (const part of header.split(',')) {
    const eq = part.indexOf('=');
    const key = part.slice(0, eq).trim();
    const value = part.slice(eq + 1).trim();
    if (key === 't' && /^\d{1,12}$/.test(value)) timestamp = Number(value);
    if (key === 'v1') candidates.push(value);
  }
  if (timestamp === null || candidates.length === 0) return false;
  const now = options.nowSecs ?? Math.floor(Date.now() / 1000);
  if (Math.abs(now - timestamp) > (options.toleranceSecs ?? SIGNATURE_TOLERANCE_SECS)) return false;
  const expected = computeSignature(secret, timestamp, body);
  return candidates.some((candidate) => safeEqualHex(candidate, expected));
}

/**
 * The associated data an endpoint's sealed secret is bound to: a sealed secret copied onto
 * another endpoint's row does not open there.
 */
export function endpointSecretContext(endpointId: string): string {
  return `webhook-secret:${endpointId}`;
}
