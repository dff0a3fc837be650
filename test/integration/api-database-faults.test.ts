/**
 * What API clients see of the database's passing trouble, and of a replica that missed a change:
 * - a fault the database means to be passing (a serialization failure, a connection it dropped)
 *   answers 503 with Retry-After, as the contract's retryable class, not a 500;
 * - `?wait=true` whose operation was recorded keeps waiting through reads of it that fail, and
 *   answers the operation;
 * - a revoked API key is refused within about a second even where the notification of the
 *   revocation never came (its lookups are cached for a second at most).
 * Real scheduler and database, a fake agent over a real websocket.
 */
import { afterAll, afterEach, beforeAll, expect, it } from 'vitest';
import { api, mintKey, startTestScheduler, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { clearDesktopsFault, failDesktopsOnce } from '../helpers/db-faults.js';

let s: TestScheduler;
let sql: Sql;
let agent: TestAgent;
let key: string;
let call: ReturnType<typeof api>;

beforeAll(async () => {
  s = await startTestScheduler();
  sql = connectDatabase(s.databaseUrl, { max: 1 });
  agent = await startFakeAgent(s.url, { delayMs: 0 });
  key = await mintKey(s.databaseUrl, 'db-faults');
  call = api(s.url, key);
});

afterEach(async () => {
  await sql`ALTER TABLE IF EXISTS operations_away RENAME TO operations`;
  await clearDesktopsFault(sql);
  await sql`ALTER TABLE api_keys ENABLE TRIGGER api_keys_changed`;
});

afterAll(async () => {
  await sql?.end();
  await agent?.stop();
  await s?.close();
});

it('answers 503 with Retry-After to a fault the database means to be passing, and the retry succeeds', async () => {
  await failDesktopsOnce(sql, '40001', 'INSERT');
  const refused = await call('POST', '/v1/desktops', { tier: 'small' }, { 'idempotency-key': 'fault-1' });
  expect(refused.status, refused.text).toBe(503);
  expect(refused.headers.get('retry-after')).toBe('1');
  expect(refused.headers.get('content-type')).toContain('application/problem+json');
  const again = await call('POST', '/v1/desktops', { tier: 'small' }, { 'idempotency-key': 'fault-1' });
  expect(again.status, again.text).toBe(201);
});

it('keeps waiting for a recorded operation through reads of it that fail', async () => {
  const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
  expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
  const driver = agent.driver!;
  const hibernate = driver.hibernate.bind(driver);
  driver.hibernate = async (desktopId, options) => {
    await new Promise((resolve) => setTimeout(resolve, 1_500));
    return hibernate(desktopId, options);
  };
  try {
    const waiting = call('POST', `/v1/desktops/${id}/hibernate?wait=true`);
    await new Promise((resolve) => setTimeout(resolve, 300));
    // For a while every read of the operation fails (as across a database restart).
    await sql`ALTER TABLE operations RENAME TO operations_away`;
    await new Promise((resolve) => setTimeout(resolve, 600));
    await sql`ALTER TABLE operations_away RENAME TO operations`;
    const answered = await waiting;
    expect(answered.status, answered.text).toBe(200);
    expect(answered.json).toMatchObject({ kind: 'hibernate', state: 'succeeded' });
  } finally {
    driver.hibernate = hibernate;
  }
}, 30_000);

it('refuses a revoked key within about a second although the notification of its revocation never came', async () => {
  const revoked = await mintKey(s.databaseUrl, 'db-faults-revoked');
  const asRevoked = api(s.url, revoked);
  expect((await asRevoked('GET', '/v1/desktops')).status).toBe(200);
  // The revocation happens without the notification every replica's cache listens for.
  await sql`ALTER TABLE api_keys DISABLE TRIGGER api_keys_changed`;
  await sql`UPDATE api_keys SET revoked_at = now() WHERE org_id = (SELECT id FROM orgs WHERE name = 'db-faults-revoked')`;
  await new Promise((resolve) => setTimeout(resolve, 1_200));
  expect((await asRevoked('GET', '/v1/desktops')).status).toBe(401);
}, 30_000);
