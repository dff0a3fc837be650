import { randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import {
  createSecretBox,
  generateSecretKey,
  hashToken,
  parseSecretKey,
  safeEqualHex,
} from '../../scheduler/src/crypto/secret-box.js';

describe('secret box', () => {
  const box = createSecretBox(randomBytes(32));

  it('round-trips text, including empty and non-ASCII', () => {
    for (const text of ['', 'FOO=bar\nTOKEN=xyz', '#!/bin/sh\necho "héllo wörld ✓"\n', 'x'.repeat(100_000)]) {
      expect(box.open(box.seal(text))).toBe(text);
    }
  });

  it('uses the documented layout: version 1, 12-byte nonce, 16-byte tag, ciphertext', () => {
    const sealed = box.seal('abc');
    expect(sealed[0]).toBe(1);
    expect(sealed.length).toBe(1 + 12 + 16 + 3);
  });

  it('uses a fresh nonce per seal', () => {
    const a = box.seal('same secret');
    const b = box.seal('same secret');
    expect(a.equals(b)).toBe(false);
    expect(a.subarray(1, 13).equals(b.subarray(1, 13))).toBe(false);
  });

  it('detects a flipped byte anywhere', () => {
    const sealed = box.seal('secret value');
    // Nonce, tag and ciphertext positions; the version byte is covered by its own check.
    for (const index of [1, 12, 13, 28, 29, sealed.length - 1]) {
      const tampered = Buffer.from(sealed);
      tampered[index] = (tampered[index] ?? 0) ^ 0x01;
      expect(() => box.open(tampered), `byte ${index}`).toThrow(/failed authentication/);
    }
    const badVersion = Buffer.from(sealed);
    badVersion[0] = 2;
    expect(() => box.open(badVersion)).toThrow(/unknown version/);
  });

  it('refuses truncated values', () => {
    const sealed = box.seal('secret value');
    expect(() => box.open(sealed.subarray(0, 10))).toThrow(/truncated/);
    expect(() => box.open(sealed.subarray(0, sealed.length - 1))).toThrow(/failed authentication/);
  });

  it('refuses the wrong key', () => {
    const other = createSecretBox(randomBytes(32));
    expect(() => other.open(box.seal('secret'))).toThrow(/failed authentication/);
  });

  it('binds to associated data when given', () => {
    const sealed = box.seal('A=1', 'desktop:d1:env');
    expect(box.open(sealed, 'desktop:d1:env')).toBe('A=1');
    expect(() => box.open(sealed, 'desktop:d2:env')).toThrow(/failed authentication/);
    expect(() => box.open(sealed)).toThrow(/failed authentication/);
  });

  it('refuses a key that is not 32 bytes', () => {
    expect(() => createSecretBox(randomBytes(16))).toThrow(/32 bytes/);
  });
});

describe('parseSecretKey', () => {
  const raw = randomBytes(32);

  it('accepts base64, URL-safe base64, unpadded base64 and hex', () => {
    expect(parseSecretKey(raw.toString('base64')).equals(raw)).toBe(true);
    expect(parseSecretKey(raw.toString('base64url')).equals(raw)).toBe(true);
    expect(parseSecretKey(raw.toString('base64').replace(/=$/, '')).equals(raw)).toBe(true);
    expect(parseSecretKey(raw.toString('hex')).equals(raw)).toBe(true);
    expect(parseSecretKey(raw.toString('hex').toUpperCase()).equals(raw)).toBe(true);
    expect(parseSecretKey(`${raw.toString('base64')}\n`).equals(raw)).toBe(true);
  });

  it('round-trips a generated key', () => {
    const key = parseSecretKey(generateSecretKey());
    expect(key.length).toBe(32);
    expect(createSecretBox(key).open(createSecretBox(key).seal('x'))).toBe('x');
  });

  it.each([
    ['empty', ''],
    ['too short base64', randomBytes(16).toString('base64')],
    ['too long base64', randomBytes(48).toString('base64')],
    ['too short hex', randomBytes(31).toString('hex')],
    ['non-base64 characters', `${'!'.repeat(43)}=`],
    ['a passphrase', 'correct horse battery staple'],
  ])('refuses %s without echoing the value', (_name, value) => {
    let message = '';
    try {
      parseSecretKey(value);
    } catch (err) {
      message = (err as Error).message;
    }
    expect(message).toMatch(/exactly 32 bytes/);
    if (value.length > 0) expect(message).not.toContain(value);
  });
});

describe('hashToken and safeEqualHex', () => {
  it('hashes to SHA-256 hex', () => {
    // Well-known test vector: SHA-256("abc").
    expect(hashToken('abc')).toBe('ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad');
    expect(hashToken('svc_sk_a')).not.toBe(hashToken('svc_sk_b'));
  });

  it('compares hex strings', () => {
    const digest = hashToken('svc_sk_secret');
    expect(safeEqualHex(digest, hashToken('svc_sk_secret'))).toBe(true);
    expect(safeEqualHex(digest, digest.toUpperCase())).toBe(true);
    expect(safeEqualHex(digest, hashToken('svc_sk_other'))).toBe(false);
    expect(safeEqualHex(digest, digest.slice(0, 62))).toBe(false);
    expect(safeEqualHex(digest, `${digest.slice(0, 62)}zz`)).toBe(false);
    expect(safeEqualHex('abc', 'abc')).toBe(false); // odd length is not hex bytes
    expect(safeEqualHex('', '')).toBe(true);
  });
});
