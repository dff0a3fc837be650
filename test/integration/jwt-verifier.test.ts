import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { exportJWK, generateKeyPair, SignJWT, type CryptoKey, type JWK } from 'jose';
import {
  createJwtVerifier,
  IdentityProviderUnavailable,
  looksLikeJwt,
  type JwtConfig,
} from '../../scheduler/src/auth/jwt-verifier.js';

const ISSUER = 'https://idp.test/';
const AUDIENCE = 'canto-api';
const ORG_CLAIM = 'https://canto.test/org';

interface KeyPair {
  publicKey: CryptoKey;
  privateKey: CryptoKey;
}

let signing: KeyPair;
let stranger: KeyPair;
let rotated: KeyPair;
let server: Server;
let baseUrl: string;
/** A URL on a port nothing listens on: connection refused. */
let deadUrl: string;

async function publicJwk(pair: KeyPair, kid?: string): Promise<JWK> {
  const jwk = await exportJWK(pair.publicKey);
  return { ...jwk, alg: 'ES256', use: 'sig', ...(kid === undefined ? {} : { kid }) };
}

function listen(s: Server): Promise<number> {
  return new Promise((resolve) => s.listen(0, '127.0.0.1', () => resolve((s.address() as AddressInfo).port)));
}

function close(s: Server): Promise<void> {
  s.closeAllConnections();
  return new Promise((resolve, reject) => s.close((err) => (err ? reject(err) : resolve())));
}

beforeAll(async () => {
  signing = await generateKeyPair('ES256');
  stranger = await generateKeyPair('ES256');
  rotated = await generateKeyPair('ES256');
  const routes: Record<string, { status: number; body: string } | 'hang'> = {
    '/jwks': { status: 200, body: JSON.stringify({ keys: [await publicJwk(signing, 'k1')] }) },
    // Two usable keys without `kid`, as during a rotation by a provider that omits kids.
    '/jwks-no-kid': {
      status: 200,
      body: JSON.stringify({ keys: [await publicJwk(signing), await publicJwk(rotated)] }),
    },
    '/jwks-500': { status: 500, body: 'internal error' },
    '/jwks-garbage': { status: 200, body: '<html>not json</html>' },
    '/jwks-not-a-set': { status: 200, body: JSON.stringify({ hello: 'world' }) },
    '/jwks-hang': 'hang',
  };
  server = createServer((req, res) => {
    const route = routes[req.url ?? ''];
    if (route === 'hang') return; // never answers; the client's timeout must fire
    if (route === undefined) {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(route.status, { 'content-type': 'application/json' }).end(route.body);
  });
  baseUrl = `http://127.0.0.1:${await listen(server)}`;

  const probe = createServer();
  deadUrl = `http://127.0.0.1:${await listen(probe)}/jwks`;
  await close(probe);
});

afterAll(async () => {
  await close(server);
});

function verifierFor(path: string, over: Partial<JwtConfig> = {}) {
  return createJwtVerifier({
    jwksUrl: `${baseUrl}${path}`,
    issuer: ISSUER,
    audience: AUDIENCE,
    orgClaim: ORG_CLAIM,
    timeoutMs: 2000,
    ...over,
  });
}

interface TokenOptions {
  key?: CryptoKey | Uint8Array;
  alg?: string;
  kid?: string | null;
  issuer?: string;
  audience?: string | string[];
  expiresAt?: number | null;
  notBefore?: number;
  claims?: Record<string, unknown>;
}

const nowSeconds = (): number => Math.floor(Date.now() / 1000);

async function token(options: TokenOptions = {}): Promise<string> {
  const kid = options.kid === undefined ? 'k1' : options.kid;
  const jwt = new SignJWT(options.claims ?? { [ORG_CLAIM]: 'org_123' })
    .setProtectedHeader({ alg: options.alg ?? 'ES256', ...(kid === null ? {} : { kid }) })
    .setIssuer(options.issuer ?? ISSUER)
    .setAudience(options.audience ?? AUDIENCE)
    .setSubject('user_42')
    .setIssuedAt();
  const expiresAt = options.expiresAt === undefined ? nowSeconds() + 3600 : options.expiresAt;
  if (expiresAt !== null) jwt.setExpirationTime(expiresAt);
  if (options.notBefore !== undefined) jwt.setNotBefore(options.notBefore);
  return jwt.sign(options.key ?? signing.privateKey);
}

function unsignedToken(): string {
  const encode = (value: object): string => Buffer.from(JSON.stringify(value)).toString('base64url');
  return `${encode({ alg: 'none' })}.${encode({
    iss: ISSUER,
    aud: AUDIENCE,
    exp: nowSeconds() + 3600,
    [ORG_CLAIM]: 'org_123',
  })}.`;
}

describe('createJwtVerifier: valid tokens', () => {
  it('accepts a valid token and returns org and subject', async () => {
    await expect(verifierFor('/jwks').verify(await token())).resolves.toEqual({
      ok: true,
      org: 'org_123',
      subject: 'user_42',
    });
  });

  it('accepts an audience array containing ours', async () => {
    const result = await verifierFor('/jwks').verify(await token({ audience: ['other', AUDIENCE] }));
    expect(result.ok).toBe(true);
  });

  it('tries every candidate key when the token has no kid and several keys match', async () => {
    const result = await verifierFor('/jwks-no-kid').verify(await token({ key: rotated.privateKey, kid: null }));
    expect(result).toEqual({ ok: true, org: 'org_123', subject: 'user_42' });
    const forged = await verifierFor('/jwks-no-kid').verify(await token({ key: stranger.privateKey, kid: null }));
    expect(forged.ok).toBe(false);
  });
});

describe('createJwtVerifier: tokens that fail verification', () => {
  const cases: Array<[string, () => Promise<string>, RegExp]> = [
    ['wrong issuer', () => token({ issuer: 'https://evil.test/' }), /iss/],
    ['wrong audience', () => token({ audience: 'someone-else' }), /aud/],
    ['expired', () => token({ expiresAt: nowSeconds() - 3600 }), /ERR_JWT_EXPIRED/],
    ['not yet valid', () => token({ notBefore: nowSeconds() + 3600 }), /nbf/],
    ['no exp claim', () => token({ expiresAt: null }), /exp/],
    ['signed by another key with the same kid', () => token({ key: stranger.privateKey }), /SIGNATURE/],
    ['signed by a key with an unknown kid', () => token({ key: stranger.privateKey, kid: 'k9' }), /NO_MATCHING_KEY/],
    ['missing org claim', () => token({ claims: { other: 'x' } }), /missing/],
    ['non-string org claim', () => token({ claims: { [ORG_CLAIM]: 123 } }), /missing or not/],
    ['empty org claim', () => token({ claims: { [ORG_CLAIM]: '' } }), /missing or not/],
  ];

  it.each(cases)('refuses a token %s', async (_name, make, reason) => {
    const result = await verifierFor('/jwks').verify(await make());
    expect(result.ok).toBe(false);
    expect(result.ok ? '' : result.reason).toMatch(reason);
  });

  // These are refused before any key is needed, so the verdict is 401 even with the provider down:
  // the verifier here points at a port where nothing listens.
  const keyless: Array<[string, () => Promise<string> | string, RegExp]> = [
    ['HS256', () => token({ key: new TextEncoder().encode('x'.repeat(32)), alg: 'HS256' }), /ALG_NOT_ALLOWED/],
    ['alg none', unsignedToken, /ALG_NOT_ALLOWED/],
    ['malformed', () => 'abc.def.ghi', /ERR_JWS_INVALID/],
    ['garbage', () => 'not-a-jwt', /ERR_JWS_INVALID/],
    ['oversized', () => `a.${'b'.repeat(20_000)}.c`, /too long/],
  ];

  it.each(keyless)('refuses a %s token without fetching keys', async (_name, make, reason) => {
    const verifier = createJwtVerifier({ jwksUrl: deadUrl, issuer: ISSUER, audience: AUDIENCE, orgClaim: ORG_CLAIM });
    const result = await verifier.verify(await make());
    expect(result.ok).toBe(false);
    expect(result.ok ? '' : result.reason).toMatch(reason);
  });
});

describe('createJwtVerifier: identity provider unavailable', () => {
  it('throws IdentityProviderUnavailable when the connection is refused', async () => {
    const verifier = createJwtVerifier({ jwksUrl: deadUrl, issuer: ISSUER, audience: AUDIENCE, orgClaim: ORG_CLAIM });
    await expect(verifier.verify(await token())).rejects.toThrow(IdentityProviderUnavailable);
  });

  it.each([
    ['answers 500', '/jwks-500'],
    ['answers 404', '/missing'],
    ['answers something that is not JSON', '/jwks-garbage'],
    ['answers JSON that is not a key set', '/jwks-not-a-set'],
  ])('throws IdentityProviderUnavailable when the provider %s', async (_name, path) => {
    await expect(verifierFor(path).verify(await token())).rejects.toThrow(IdentityProviderUnavailable);
  });

  it('throws IdentityProviderUnavailable when the fetch times out', async () => {
    const verifier = verifierFor('/jwks-hang', { timeoutMs: 200 });
    const error = await verifier.verify(await token()).then(
      () => null,
      (err: unknown) => err,
    );
    expect(error).toBeInstanceOf(IdentityProviderUnavailable);
    expect((error as Error).message).toMatch(/TIMEOUT/);
  });
});

describe('looksLikeJwt', () => {
  it('tells JWTs from API keys and garbage', async () => {
    expect(looksLikeJwt(await token())).toBe(true);
    expect(looksLikeJwt(unsignedToken())).toBe(true);
    expect(looksLikeJwt('svc_sk_0123456789abcdef')).toBe(false);
    expect(looksLikeJwt('a.b')).toBe(false);
    expect(looksLikeJwt('a.b.c.d')).toBe(false);
    expect(looksLikeJwt('a+b.c.d')).toBe(false);
    expect(looksLikeJwt('')).toBe(false);
  });
});
