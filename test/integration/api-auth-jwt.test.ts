/**
 * JWT bearer authentication through the scheduler (docs/api.md §5): a local identity provider publishing
 * its JWKS, tokens signed with jose. A valid token acts in the org its claim names (the same org an
 * API key of that org name acts in); a token failing verification is 401; an unreachable identity
 * provider is 503, while API keys keep working.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { exportJWK, generateKeyPair, SignJWT, type CryptoKey } from 'jose';
import { api, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { connectDatabase } from '../../scheduler/src/store/db.js';
import { expectProblem } from '../helpers/problem.js';

const ISSUER = 'https://idp.test/';
const AUDIENCE = 'canto-api';
// A namespaced claim name with dots and slashes, taken literally.
const ORG_CLAIM = 'https://canto.test/org';

let signing: CryptoKey;
let stranger: CryptoKey;
let idp: Server;
let s: TestScheduler;
let idpDown: TestScheduler;

function listen(server: Server): Promise<number> {
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve((server.address() as AddressInfo).port)));
}

function close(server: Server): Promise<void> {
  server.closeAllConnections();
  return new Promise((resolve, reject) => server.close((err) => (err ? reject(err) : resolve())));
}

const jwtEnv = (jwksUrl: string) => ({
  CANTO_JWT_JWKS_URL: jwksUrl,
  CANTO_JWT_ISSUER: ISSUER,
  CANTO_JWT_AUDIENCE: AUDIENCE,
  CANTO_JWT_ORG_CLAIM: ORG_CLAIM,
});

beforeAll(async () => {
  const pair = await generateKeyPair('ES256');
  signing = pair.privateKey;
  stranger = (await generateKeyPair('ES256')).privateKey;
  const jwks = JSON.stringify({ keys: [{ ...(await exportJWK(pair.publicKey)), kid: 'k1', alg: 'ES256', use: 'sig' }] });
  idp = createServer((req, res) => {
    if (req.url !== '/jwks') return void res.writeHead(404).end();
    res.writeHead(200, { 'content-type': 'application/json' }).end(jwks);
  });
  const port = await listen(idp);

  // A port nothing listens on: the identity provider is down for the second scheduler.
  const probe = createServer();
  const deadPort = await listen(probe);
  await close(probe);

  [s, idpDown] = await Promise.all([
    startTestScheduler(jwtEnv(`http://127.0.0.1:${port}/jwks`)),
    startTestScheduler(jwtEnv(`http://127.0.0.1:${deadPort}/jwks`)),
  ]);
});

afterAll(async () => {
  await Promise.all([s?.close(), idpDown?.close()]);
  if (idp) await close(idp);
});

interface TokenOptions {
  key?: CryptoKey | Uint8Array;
  alg?: string;
  issuer?: string;
  audience?: string;
  expiresAt?: number;
  claims?: Record<string, unknown>;
}

const now = () => Math.floor(Date.now() / 1000);

function token(org: string, o: TokenOptions = {}): Promise<string> {
  return new SignJWT(o.claims ?? { [ORG_CLAIM]: org })
    .setProtectedHeader({ alg: o.alg ?? 'ES256', kid: 'k1' })
    .setIssuer(o.issuer ?? ISSUER)
    .setAudience(o.audience ?? AUDIENCE)
    .setSubject('user_1')
    .setIssuedAt()
    .setExpirationTime(o.expiresAt ?? now() + 600)
    .sign(o.key ?? signing);
}

describe('valid tokens', () => {
  it('act in the org named by the claim, the same org as an API key of that name', async () => {
    const asJwt = api(s.url, await token('jwt-org'));
    const listed = await asJwt('GET', '/v1/desktops');
    expect(listed.status, listed.text).toBe(200);
    expect(listed.json).toEqual({ desktops: [] });

    const created = await asJwt('POST', '/v1/desktops', { tier: 'small' });
    expect(created.status, created.text).toBe(201);

    const asKey = api(s.url, await mintKey(s.databaseUrl, 'jwt-org'));
    const seen = await asKey('GET', `/v1/desktops/${created.json.id}`);
    expect(seen.status).toBe(200);
    expect(seen.json).toEqual(created.json);
    expect((await asKey('GET', '/v1/desktops')).json.desktops.map((d: { id: string }) => d.id)).toEqual([created.json.id]);

    // And the other way round: what the key creates, the token sees.
    const byKey = await asKey('POST', '/v1/desktops', { tier: 'default' });
    expect((await asJwt('GET', `/v1/desktops/${byKey.json.id}`)).status).toBe(200);
  });

  it("a token of another org does not see this org's desktops", async () => {
    const mine = await api(s.url, await token('jwt-org'))('POST', '/v1/desktops', { tier: 'small' });
    const other = api(s.url, await token('jwt-other-org'));
    expectProblem(await other('GET', `/v1/desktops/${mine.json.id}`), 404);
    expect((await other('GET', '/v1/desktops')).json).toEqual({ desktops: [] });
  });

  it('resolves a known org without the database: it answers while the orgs table is locked', async () => {
    const c = api(s.url, await token('jwt-cached-org'));
    expect((await c('GET', '/v1/desktops')).status).toBe(200);
    const db = connectDatabase(s.databaseUrl, { max: 1 });
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let locked!: () => void;
    const isLocked = new Promise<void>((resolve) => (locked = resolve));
    const tx = db.begin(async (t) => {
      await t`LOCK TABLE orgs IN ACCESS EXCLUSIVE MODE`;
      locked();
      await held;
    });
    try {
      await isLocked;
      const answered = await Promise.race([c('GET', '/v1/desktops').then((r) => r.status), new Promise((r) => setTimeout(() => r('blocked'), 3_000))]);
      expect(answered).toBe(200);
    } finally {
      release();
      await tx;
      await db.end();
    }
  });

  it('drops a cached org when its row changes', async () => {
    const c = api(s.url, await token('jwt-renamed-org'));
    const created = await c('POST', '/v1/desktops', { tier: 'small' });
    expect(created.status).toBe(201);
    const db = connectDatabase(s.databaseUrl, { max: 1 });
    try {
      await db`UPDATE orgs SET name = 'jwt-renamed-org-old' WHERE name = 'jwt-renamed-org'`;
    } finally {
      await db.end();
    }
    // The name now belongs to nobody: the next request creates a fresh org, which owns nothing.
    await until(async () => (await c('GET', '/v1/desktops')).json.desktops.length === 0, 2_000, 'the rename to be heard');
    expectProblem(await c('GET', `/v1/desktops/${created.json.id}`), 404);
  });

  it('lifecycle routes accept it too', async () => {
    const c = api(s.url, await token('jwt-org'));
    const id = (await c('POST', '/v1/desktops', { tier: 'small' })).json.id;
    const wake = await c('POST', `/v1/desktops/${id}/wake`);
    expect(wake.status, wake.text).toBe(202);
    expect((await c('GET', `/v1/operations/${wake.json.id}`)).status).toBe(200);
  });
});

describe('tokens failing verification are 401', () => {
  const cases: Array<[string, () => Promise<string>]> = [
    ['a bad signature', () => token('jwt-org', { key: stranger })],
    ['an expired token', () => token('jwt-org', { expiresAt: now() - 600 })],
    ['a wrong audience', () => token('jwt-org', { audience: 'someone-else' })],
    ['a wrong issuer', () => token('jwt-org', { issuer: 'https://evil.test/' })],
    ['no org claim', () => token('jwt-org', { claims: { org_id: 'jwt-org' } })],
    ['an empty org claim', () => token('', {})],
    ['an org claim longer than an org name may be', () => token('o'.repeat(201), {})],
    ['an org claim holding a control character', () => token('jwt-org\nforged log line', {})],
    ['an org claim that ends with a space, like another org', () => token('jwt-org ', {})],
    ['a symmetric algorithm', () => token('jwt-org', { alg: 'HS256', key: new TextEncoder().encode('k'.repeat(32)) })],
    [
      'alg none',
      async () => {
        const part = (v: object) => Buffer.from(JSON.stringify(v)).toString('base64url');
        return `${part({ alg: 'none' })}.${part({ iss: ISSUER, aud: AUDIENCE, exp: now() + 600, [ORG_CLAIM]: 'jwt-org' })}.`;
      },
    ],
    [
      'a tampered payload',
      async () => {
        const [h, , sig] = (await token('jwt-org')).split('.');
        const payload = Buffer.from(JSON.stringify({ iss: ISSUER, aud: AUDIENCE, exp: now() + 600, [ORG_CLAIM]: 'victim' })).toString('base64url');
        return `${h}.${payload}.${sig}`;
      },
    ],
  ];

  it.each(cases)('%s', async (_name, make) => {
    const c = api(s.url, await make());
    expectProblem(await c('GET', '/v1/desktops'), 401);
    expectProblem(await c('POST', '/v1/desktops', { tier: 'small' }), 401);
  });

  it('no desktop was created by any refused token', async () => {
    const victim = api(s.url, await token('victim'));
    expect((await victim('GET', '/v1/desktops')).json).toEqual({ desktops: [] });
  });
});

describe('identity provider unreachable', () => {
  it('a JWT is answered 503 problem+json, on reads and mutations', async () => {
    const c = api(idpDown.url, await token('jwt-org'));
    for (const [method, path, body] of [
      ['GET', '/v1/desktops', undefined],
      ['POST', '/v1/desktops', { tier: 'small' }],
      ['POST', '/v1/desktops/dsk_000000000000000000000000/wake', {}],
      ['GET', '/v1/usage', undefined],
    ] as const) {
      const res = await c(method, path, body);
      expectProblem(res, 503, `${method} ${path}`);
      expect(res.text).not.toMatch(/ECONNREFUSED|fetch failed|127\.0\.0\.1/);
    }
  });

  it('API keys keep working, and non-JWT garbage is still 401', async () => {
    const key = await mintKey(idpDown.databaseUrl, 'keyed');
    expect((await api(idpDown.url, key)('GET', '/v1/desktops')).status).toBe(200);
    expectProblem(await api(idpDown.url, 'not-a-jwt')('GET', '/v1/desktops'), 401);
  });

  it('a token with a disallowed algorithm is 401, not 503', async () => {
    const hs = await token('jwt-org', { alg: 'HS256', key: new TextEncoder().encode('k'.repeat(32)) });
    expectProblem(await api(idpDown.url, hs)('GET', '/v1/desktops'), 401);
  });
});
