/**
 * Bad input, table-driven: every request rule of docs/api.md §2.2–2.4, 4.1, 4.11, 5 and 7 as one row,
 * sent over a real socket to a real scheduler. Every rejected row must answer the right status
 * as problem+json; the boundary rows that must pass are in the same tables, so an off-by-one in
 * either direction shows up.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectDatabase } from '../../scheduler/src/store/db.js';
import { hashToken } from '../../scheduler/src/crypto/secret-box.js';
import { api, mintKey, readResponse, startTestScheduler, type TestScheduler } from '../helpers/scheduler.js';
import { expectProblem, type ApiResponse } from '../helpers/problem.js';

let s: TestScheduler;
let key: string;
/** A desktop of the caller's org that validation rows may point at; never mutated by them. */
let desktopId: string;
let operationId: string;

const MISSING_DESKTOP = 'dsk_000000000000000000000000';
const MISSING_OPERATION = 'op_000000000000000000000000';
const KIB = 1024;

interface Row {
  name: string;
  method: string;
  /** `:id` is replaced by the shared desktop's id, `:op` by an operation id. */
  path: string;
  /** A string is sent verbatim; anything else as JSON. Undefined sends no body. */
  body?: unknown;
  headers?: Record<string, string>;
  /** `null` sends no Authorization header at all. Default: the org's API key. */
  auth?: string | null;
  status: number;
}

async function send(row: Row): Promise<ApiResponse> {
  const headers: Record<string, string> = {};
  const auth = row.auth === undefined ? `Bearer ${key}` : row.auth;
  if (auth !== null) headers.authorization = auth;
  if (row.body !== undefined) headers['content-type'] = 'application/json';
  Object.assign(headers, row.headers);
  const path = row.path.replace(':id', desktopId).replace(':op', operationId);
  const res = await fetch(s.url + path, {
    method: row.method,
    headers,
    body: row.body === undefined ? undefined : typeof row.body === 'string' ? row.body : JSON.stringify(row.body),
  });
  return readResponse(res);
}

async function check(row: Row): Promise<ApiResponse> {
  const res = await send(row);
  if (row.status >= 300) {
    expectProblem(res, row.status, row.name);
  } else {
    expect(res.status, `${row.name} → ${res.text.slice(0, 300)}`).toBe(row.status);
    expect(res.headers.get('content-type')).toMatch(/^application\/json\b/);
  }
  return res;
}

const create = (name: string, body: unknown, status: number, headers?: Record<string, string>): Row => ({
  name,
  method: 'POST',
  path: '/v1/desktops',
  body,
  status,
  ...(headers ? { headers } : {}),
});

/** `{"A":"xxx…"}` serializes to exactly `bytes` bytes. */
const envOfSize = (bytes: number) => ({ A: 'x'.repeat(bytes - '{"A":""}'.length) });
const manyKeys = (n: number) => Object.fromEntries(Array.from({ length: n }, (_, i) => [`K${i}`, 'v']));

beforeAll(async () => {
  s = await startTestScheduler();
  key = await mintKey(s.databaseUrl, 'validation-org');
  const call = api(s.url, key);
  desktopId = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id;
  const other = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id;
  operationId = (await call('POST', `/v1/desktops/${other}/wake`)).json.id;
  expect(desktopId).toMatch(/^dsk_/);
  expect(operationId).toMatch(/^op_/);
});

afterAll(async () => {
  await s?.close();
});

describe('docs/api.md §2.2 CreateDesktopBody', () => {
  const rows: Row[] = [
    create('tier missing', {}, 400),
    create('empty body (tier missing)', '', 400),
    create('tier unknown', { tier: 'huge' }, 400),
    create('tier wrong case', { tier: 'Small' }, 400),
    create('tier not a string', { tier: 1 }, 400),
    create('tier null', { tier: null }, 400),
    create('billing_mode unknown', { tier: 'small', billing_mode: 'weekly' }, 400),
    create('billing_mode not a string', { tier: 'small', billing_mode: 1 }, 400),
    create('image_version not a string', { tier: 'small', image_version: 12 }, 400),
    create('image_version an object', { tier: 'small', image_version: {} }, 400),
    create('idle_timeout_secs negative', { tier: 'small', idle_timeout_secs: -1 }, 400),
    create('idle_timeout_secs non-integer', { tier: 'small', idle_timeout_secs: 1.5 }, 400),
    create('idle_timeout_secs a string', { tier: 'small', idle_timeout_secs: '60' }, 400),
    create('idle_timeout_secs a boolean', { tier: 'small', idle_timeout_secs: true }, 400),
    create('env not an object', { tier: 'small', env: 'A=b' }, 400),
    create('env an array', { tier: 'small', env: ['A'] }, 400),
    create('env 101 keys', { tier: 'small', env: manyKeys(101) }, 400),
    create('env 100 keys', { tier: 'small', env: manyKeys(100) }, 201),
    create('env 64 KiB + 1 serialized', { tier: 'small', env: envOfSize(64 * KIB + 1) }, 400),
    create('env exactly 64 KiB serialized', { tier: 'small', env: envOfSize(64 * KIB) }, 201),
    create('env key with a leading digit', { tier: 'small', env: { '1A': 'v' } }, 400),
    create('env key with a dash', { tier: 'small', env: { 'A-B': 'v' } }, 400),
    create('env key empty', { tier: 'small', env: { '': 'v' } }, 400),
    create('env key with a space', { tier: 'small', env: { 'A B': 'v' } }, 400),
    create('env key non-ASCII', { tier: 'small', env: { 'É': 'v' } }, 400),
    create('env value a number', { tier: 'small', env: { A: 1 } }, 400),
    create('env value null', { tier: 'small', env: { A: null } }, 400),
    create('env value an object', { tier: 'small', env: { A: {} } }, 400),
    create('env valid keys', { tier: 'small', env: { _A: '', a_1: 'x', Z9: 'y' } }, 201),
    create('setup_script not a string', { tier: 'small', setup_script: 1 }, 400),
    create('setup_script 64 KiB + 1', { tier: 'small', setup_script: 'x'.repeat(64 * KIB + 1) }, 400),
    create('setup_script exactly 64 KiB', { tier: 'small', setup_script: 'x'.repeat(64 * KIB) }, 201),
    // The cap is in bytes: 32769 two-byte characters are 65538 bytes.
    create('setup_script over 64 KiB in UTF-8 bytes', { tier: 'small', setup_script: 'é'.repeat(32 * KIB + 1) }, 400),
    create('body null', 'null', 400),
    create('body an array', '[]', 400),
    create('body a string', '"small"', 400),
  ];
  it.each(rows)('$name → $status', async (row) => {
    await check(row);
  });

  const defaults: Array<[string, Record<string, unknown>, Record<string, unknown>]> = [
    ['billing_mode omitted', {}, { billing_mode: 'hourly' }],
    ['billing_mode empty', { billing_mode: '' }, { billing_mode: 'hourly' }],
    ['billing_mode null', { billing_mode: null }, { billing_mode: 'hourly' }],
    ['billing_mode monthly', { billing_mode: 'monthly' }, { billing_mode: 'monthly' }],
    ['idle_timeout_secs null', { idle_timeout_secs: null }, { idle_timeout_secs: 0 }],
    ['idle_timeout_secs 0', { idle_timeout_secs: 0 }, { idle_timeout_secs: 0 }],
    ['image_version null', { image_version: null }, { image_version: 'debian-12' }],
  ];
  it.each(defaults)('%s → 201 with %o', async (_name, extra, expected) => {
    const res = await check(create('default', { tier: 'default', ...extra }, 201));
    expect(res.json).toMatchObject(expected);
  });
});

describe('docs/api.md §2.3 UpdateDesktopBody', () => {
  const rows: Row[] = [
    { name: 'idle_timeout_secs negative', method: 'PATCH', path: '/v1/desktops/:id', body: { idle_timeout_secs: -5 }, status: 400 },
    { name: 'idle_timeout_secs non-integer', method: 'PATCH', path: '/v1/desktops/:id', body: { idle_timeout_secs: 0.5 }, status: 400 },
    { name: 'idle_timeout_secs a string', method: 'PATCH', path: '/v1/desktops/:id', body: { idle_timeout_secs: '5' }, status: 400 },
    { name: 'body an array', method: 'PATCH', path: '/v1/desktops/:id', body: '[]', status: 400 },
  ];
  it.each(rows)('$name → $status', async (row) => {
    await check(row);
  });

  it.each([
    ['no body at all', undefined],
    ['an empty JSON body', ''],
    ['{}', {}],
  ])('%s is a no-op returning the desktop unchanged', async (_name, body) => {
    const before = await api(s.url, key)('GET', `/v1/desktops/${desktopId}`);
    const res = await check({ name: 'patch no-op', method: 'PATCH', path: '/v1/desktops/:id', body, status: 200 });
    expect(res.json).toEqual(before.json);
  });
});

describe('docs/api.md §2.4 MutationBody', () => {
  const rows: Row[] = (['wake', 'hibernate', 'destroy'] as const).flatMap((kind) => [
    { name: `${kind}: expected_generation non-integer`, method: 'POST', path: `/v1/desktops/:id/${kind}`, body: { expected_generation: 1.5 }, status: 400 },
    { name: `${kind}: expected_generation a string`, method: 'POST', path: `/v1/desktops/:id/${kind}`, body: { expected_generation: '0' }, status: 400 },
    { name: `${kind}: body an array`, method: 'POST', path: `/v1/desktops/:id/${kind}`, body: '[]', status: 400 },
  ]);
  it.each(rows)('$name → $status', async (row) => {
    await check(row);
  });

  it.each([
    ['no body at all', undefined, undefined],
    ['an empty JSON body', '', undefined],
    ['an empty form body (curl -d \'\')', '', 'application/x-www-form-urlencoded'],
    ['an empty text body', '', 'text/plain'],
    ['{}', {}, undefined],
    ['expected_generation null', { expected_generation: null }, undefined],
  ])('wake with %s is accepted', async (_name, body, contentType) => {
    const id = (await api(s.url, key)('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
    const headers: Record<string, string> = contentType ? { 'content-type': contentType } : {};
    const res = await send({ name: 'wake', method: 'POST', path: `/v1/desktops/${id}/wake`, body, headers, status: 202 });
    expect(res.status, res.text).toBe(202);
    expect(res.json).toMatchObject({ desktop_id: id, kind: 'wake' });
  });
});

describe('docs/api.md §4.1, 4.2 ids, filters, wait and Idempotency-Key', () => {
  const badIds = ['nope', 'dsk_short', 'dsk_ABCDEFGHIJKLMNOPQRSTUVWX', 'op_000000000000000000000000', 'dsk_000000000000000000000000x'];
  const idRoutes: Array<[string, string, unknown]> = [
    ['GET', '', undefined],
    ['PATCH', '', {}],
    ['POST', '/wake', {}],
    ['POST', '/hibernate', {}],
    ['POST', '/destroy', {}],
    ['POST', '/fork', { count: 1, acknowledge_shared_state: true }],
  ];
  const malformed: Row[] = idRoutes.flatMap(([method, suffix, body]) =>
    badIds.map((id) => ({ name: `${method} /v1/desktops/${id}${suffix}`, method, path: `/v1/desktops/${id}${suffix}`, body, status: 400 })),
  );
  const rows: Row[] = [
    ...malformed,
    { name: 'operation id malformed', method: 'GET', path: '/v1/operations/nope', status: 400 },
    { name: 'desktop id given as operation id', method: 'GET', path: `/v1/operations/${MISSING_DESKTOP}`, status: 400 },
    { name: 'state filter unknown', method: 'GET', path: '/v1/desktops?state=sleeping', status: 400 },
    { name: 'state filter wrong case', method: 'GET', path: '/v1/desktops?state=AWAKE', status: 400 },
    { name: 'state filter valid', method: 'GET', path: '/v1/desktops?state=provisioning', status: 200 },
    { name: 'desktop absent', method: 'GET', path: `/v1/desktops/${MISSING_DESKTOP}`, status: 404 },
    { name: 'operation absent', method: 'GET', path: `/v1/operations/${MISSING_OPERATION}`, status: 404 },
    ...['wake', 'hibernate', 'destroy', 'fork'].flatMap((kind) =>
      ['1', 'yes', 'TRUE', '0', ''].map((wait) => ({
        name: `${kind}?wait=${wait}`,
        method: 'POST',
        path: `/v1/desktops/:id/${kind}?wait=${wait}`,
        body: kind === 'fork' ? { count: 1, acknowledge_shared_state: true } : {},
        status: 400,
      })),
    ),
    ...['start=abc', 'end=1e3', 'start=-5', 'start=%201', 'start=1.5', 'start=2&end=1', 'end=9000000000000000', 'start=1&start=2', 'start='].map(
      (q) => ({ name: `usage ?${q}`, method: 'GET', path: `/v1/usage?${q}`, status: 400 }),
    ),
    { name: 'usage with an explicit range', method: 'GET', path: `/v1/usage?start=0&end=${Date.now()}`, status: 200 },
    { name: 'usage with an empty range', method: 'GET', path: '/v1/usage?start=5&end=5', status: 200 },
    create('non-ASCII Idempotency-Key on create', { tier: 'small' }, 400, { 'idempotency-key': 'clé-1' }),
    create('control character in Idempotency-Key on create', { tier: 'small' }, 400, { 'idempotency-key': 'a\tb' }),
    ...['wake', 'hibernate', 'destroy'].map((kind) => ({
      name: `non-ASCII Idempotency-Key on ${kind}`,
      method: 'POST',
      path: `/v1/desktops/:id/${kind}`,
      headers: { 'idempotency-key': 'schlüssel' },
      status: 400,
    })),
  ];
  it.each(rows)('$name → $status', async (row) => {
    await check(row);
  });

  it('the shared desktop is untouched by all the rejected requests', async () => {
    const res = await api(s.url, key)('GET', `/v1/desktops/${desktopId}`);
    expect(res.json).toMatchObject({ state: 'provisioning', generation: 0 });
    const ops = await api(s.url, key)('GET', `/v1/desktops?state=waking`);
    expect(ops.json.desktops.map((d: { id: string }) => d.id)).not.toContain(desktopId);
  });
});

describe('docs/api.md §5 authentication', () => {
  const routes: Array<[string, string, unknown]> = [
    ['GET', '/v1/desktops', undefined],
    ['POST', '/v1/desktops', { tier: 'small' }],
    ['GET', '/v1/desktops/:id', undefined],
    ['PATCH', '/v1/desktops/:id', {}],
    ['POST', '/v1/desktops/:id/wake', {}],
    ['POST', '/v1/desktops/:id/hibernate', {}],
    ['POST', '/v1/desktops/:id/destroy', {}],
    ['POST', '/v1/desktops/:id/fork', { count: 1, acknowledge_shared_state: true }],
    ['GET', '/v1/operations/:op', undefined],
    ['GET', '/v1/usage', undefined],
  ];
  const credentials: Array<[string, string | null]> = [
    ['missing header', null],
    ['empty header', ''],
    ['Basic scheme', 'Basic dXNlcjpwYXNz'],
    ['key without a scheme', 'svc_sk_abcdefghijklmnop'],
    ['Bearer without a credential', 'Bearer'],
    ['garbage', 'Bearer !!garbage!!'],
    ['JWT-shaped, JWT not configured', 'Bearer aaaa.bbbb.cccc'],
    ['unknown svc_sk_ key', 'Bearer svc_sk_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA'],
    ['bare prefix', 'Bearer svc_sk_'],
  ];
  const rows: Row[] = routes.flatMap(([method, path, body]) =>
    credentials.map(([what, auth]) => ({ name: `${method} ${path} with ${what}`, method, path, body, auth, status: 401 })),
  );
  it.each(rows)('$name → 401', async (row) => {
    await check(row);
  });

  it('a revoked key is 401', async () => {
    const revoked = await mintKey(s.databaseUrl, 'validation-org');
    const sql = connectDatabase(s.databaseUrl, { max: 1 });
    try {
      await sql`UPDATE api_keys SET revoked_at = now() WHERE token_hash = ${hashToken(revoked)}`;
    } finally {
      await sql.end();
    }
    await check({ name: 'revoked', method: 'GET', path: '/v1/desktops', auth: `Bearer ${revoked}`, status: 401 });
  });
});

describe('docs/api.md §7 errors', () => {
  const big = `{"tier":"small","setup_script":"${'x'.repeat(2 * 1024 * KIB)}"}`;
  const rows: Row[] = [
    create('malformed JSON on create', '{"tier":', 400),
    create('trailing garbage on create', '{"tier":"small"} x', 400),
    create('__proto__ key (prototype poisoning) on create', '{"tier":"small","env":{"__proto__":{"A":"b"}}}', 400),
    create('constructor.prototype key on create', '{"tier":"small","constructor":{"prototype":{"x":1}}}', 400),
    { name: 'malformed JSON on patch', method: 'PATCH', path: '/v1/desktops/:id', body: '{idle', status: 400 },
    { name: 'malformed JSON on wake', method: 'POST', path: '/v1/desktops/:id/wake', body: '{', status: 400 },
    create('body over 2 MiB on create', big, 413),
    { name: 'body over 2 MiB on wake', method: 'POST', path: '/v1/desktops/:id/wake', body: big, status: 413 },
    { name: 'unknown /v1 route', method: 'GET', path: '/v1/nope', status: 404 },
    { name: 'unknown route outside /v1', method: 'GET', path: '/', status: 404 },
    { name: 'unknown sub-route of a desktop', method: 'POST', path: '/v1/desktops/:id/explode', body: {}, status: 404 },
    { name: 'unrouted method on a desktop', method: 'DELETE', path: '/v1/desktops/:id', status: 404 },
    { name: 'body over 2 MiB to an unknown route (a mistyped upload)', method: 'PUT', path: '/v1/desktops/:id/files', body: big, status: 404 },
    {
      name: 'unsupported content type to an unknown route',
      method: 'PUT',
      path: '/v1/desktops/:id/file/root/x',
      body: 'x',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      status: 404,
    },
    {
      name: 'a non-empty text body',
      method: 'POST',
      path: '/v1/desktops/:id/wake',
      body: '{}',
      headers: { 'content-type': 'text/plain' },
      status: 415,
    },
    {
      name: 'unsupported content type',
      method: 'POST',
      path: '/v1/desktops',
      body: 'tier=small',
      headers: { 'content-type': 'application/x-www-form-urlencoded' },
      status: 415,
    },
  ];
  it.each(rows)('$name → $status', async (row) => {
    await check(row);
  });

  it('the openapi document needs no credentials', async () => {
    const res = await send({ name: 'openapi', method: 'GET', path: '/v1/openapi.json', auth: null, status: 200 });
    expect(res.status).toBe(200);
  });
});
