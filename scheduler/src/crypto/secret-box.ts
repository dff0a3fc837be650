/**
 * Sealing of write-only secrets (a desktop's `env` and `setup_script`) before they are stored in
 * PostgreSQL, plus the hashing used for bearer credentials.
 *
 * A sealed value is `version (1 byte, = 1) | nonce (12 bytes) | tag (16 bytes) | ciphertext`,
 * produced by AES-256-GCM with a fresh random nonce per seal. GCM authenticates as well as
 * encrypts, so a flipped byte, a truncated value or the wrong key makes `open` throw instead of
 * returning garbage. The version byte leaves room for key rotation or another cipher without a
 * data migration. An optional associated-data string binds a sealed value to its context (for a
 * desktop's secrets, its org and the field: crypto/desktop-secrets.ts): it is not stored, but
 * opening with a different context fails, so someone who can write the database cannot move one
 * org's secrets to another's desktops, or an `env` into a `setup_script`.
 *
 * Random 96-bit nonces are safe for far more seals than this service will ever make with one key
 * (NIST SP 800-38D caps a key at 2^32 random-nonce invocations).
 */
import { createCipheriv, createDecipheriv, hash, randomBytes, timingSafeEqual } from 'node:crypto';

const VERSION = 1;
const KEY_BYTES = 32;
const NONCE_BYTES = 12;
const TAG_BYTES = 16;
const HEADER_BYTES = 1 + NONCE_BYTES + TAG_BYTES;
const ALGORITHM = 'aes-256-gcm';

export interface SecretBox {
  /** Encrypts and authenticates `plaintext`; every call uses a new nonce, so equal inputs differ. */
  seal(plaintext: string, associatedData?: string): Buffer;
  /** Reverses `seal`; throws if the value was altered, truncated, or sealed with another key/context. */
  open(sealed: Buffer, associatedData?: string): string;
}

export function createSecretBox(key: Buffer): SecretBox {
  if (key.length !== KEY_BYTES) throw new RangeError(`secret key must be ${KEY_BYTES} bytes, got ${key.length}`);
  // Copied so a caller that later zeroes or reuses its buffer cannot change our key.
  const ownKey = Buffer.from(key);

  return {
    seal(plaintext, associatedData) {
      const nonce = randomBytes(NONCE_BYTES);
      const cipher = createCipheriv(ALGORITHM, ownKey, nonce, { authTagLength: TAG_BYTES });
      if (associatedData !== undefined) cipher.setAAD(Buffer.from(associatedData, 'utf8'));
      const ciphertext = Buffer.concat([cipher.update(plaintext, 'utf8'), cipher.final()]);
      return Buffer.concat([Buffer.of(VERSION), nonce, cipher.getAuthTag(), ciphertext]);
    },

    open(sealed, associatedData) {
      if (sealed.length < HEADER_BYTES) throw new Error('sealed secret is truncated');
      if (sealed[0] !== VERSION) throw new Error(`sealed secret has unknown version ${String(sealed[0])}`);
      const nonce = sealed.subarray(1, 1 + NONCE_BYTES);
      const tag = sealed.subarray(1 + NONCE_BYTES, HEADER_BYTES);
      const ciphertext = sealed.subarray(HEADER_BYTES);
      const decipher = createDecipheriv(ALGORITHM, ownKey, nonce, { authTagLength: TAG_BYTES });
      decipher.setAuthTag(tag);
      if (associatedData !== undefined) decipher.setAAD(Buffer.from(associatedData, 'utf8'));
      try {
        // `final` is where GCM checks the tag; nothing decrypted is returned before it passes.
        return Buffer.concat([decipher.update(ciphertext), decipher.final()]).toString('utf8');
      } catch {
        // Node's message ("Unsupported state or unable to authenticate data") is unhelpful.
        throw new Error('sealed secret failed authentication (tampered, or wrong key or context)');
      }
    },
  };
}

const HEX_KEY = /^[0-9a-fA-F]{64}$/;
// 32 bytes is 43 base64 characters plus one '=' of padding (optional); both alphabets accepted.
const BASE64_KEY = /^[A-Za-z0-9+/_-]{43}=?$/;

/**
 * Parses the configured sealing key: 32 bytes as base64 (standard or URL-safe) or as 64 hex
 * digits. Surrounding whitespace (a trailing newline from a secrets file) is ignored. Errors never
 * echo the value, since it is a secret.
 */
export function parseSecretKey(value: string): Buffer {
  const trimmed = value.trim();
  // Hex first: 64 hex digits are also valid base64 characters, but of the wrong length (48 bytes).
  if (HEX_KEY.test(trimmed)) return Buffer.from(trimmed, 'hex');
  if (BASE64_KEY.test(trimmed)) {
    const key = Buffer.from(trimmed.replace(/-/g, '+').replace(/_/g, '/'), 'base64');
    if (key.length === KEY_BYTES) return key;
  }
  throw new Error(
    `secret key must be exactly ${KEY_BYTES} bytes encoded as base64 (44 characters) or hex ` +
      `(64 characters); got ${trimmed.length} characters. Generate one with \`openssl rand -base64 32\`.`,
  );
}

/** A fresh random sealing key, base64-encoded. */
export function generateSecretKey(): string {
  return randomBytes(KEY_BYTES).toString('base64');
}

/**
 * SHA-256 hex digest of a bearer credential (API key, join token), which is what gets stored.
 * A slow password hash (bcrypt, scrypt, argon2) exists to make guessing low-entropy human
 * passwords expensive; these tokens are long random strings that cannot be guessed, so the
 * slowness would buy nothing and would cost CPU on every authenticated request. A fast,
 * unsalted hash also lets the store look a key up by its hash with an index.
 */
export function hashToken(token: string): string {
  // The one-shot hash: the ingress hashes a private exposure's token on every request.
  return hash('sha256', token, 'hex');
}

const HEX = /^(?:[0-9a-fA-F]{2})*$/;

/**
 * Compares two hex strings (e.g. digests or HMACs) in time independent of where they differ, so
 * a remote caller cannot discover a correct value byte by byte. Malformed hex or different
 * lengths return false; the length is not a secret for fixed-size digests.
 */
export function safeEqualHex(a: string, b: string): boolean {
  if (!HEX.test(a) || !HEX.test(b) || a.length !== b.length) return false;
  return timingSafeEqual(Buffer.from(a, 'hex'), Buffer.from(b, 'hex'));
}
