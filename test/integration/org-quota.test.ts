/**
 * The per-org desktop quota (CANTO_ORG_DESKTOP_QUOTA, SPEC §8): creates and forks past it are
 * refused with a 409 problem, counted under the org's lock so that creates at once cannot pass it
 * together (nor deadlock on it); another org is not affected; a repeated create answers the desktop
 * it made; destroying a desktop makes room.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';

describe('the per-org desktop quota', () => {
  let s: TestScheduler;
  let agent: TestAgent;
  let acme: ReturnType<typeof api>;
  let other: ReturnType<typeof api>;

  beforeAll(async () => {
    s = await startTestScheduler({ CANTO_ORG_DESKTOP_QUOTA: '3' });
    agent = await startFakeAgent(s.url);
    acme = api(s.url, await mintKey(s.databaseUrl, 'quota-acme'));
    other = api(s.url, await mintKey(s.databaseUrl, 'quota-other'));
  });

  afterAll(async () => {
    await agent?.stop();
    await s?.close();
  });

  it('refuses creates and forks past it, with a problem, and counts creates at once under one lock', async () => {
    const five = await Promise.all(Array.from({ length: 5 }, (_, i) => acme('POST', '/v1/desktops', { tier: 'small' }, { 'idempotency-key': `q-${i}` })));
    expect(five.map((r) => r.status).sort()).toEqual([201, 201, 201, 409, 409]);
    const refused = five.find((r) => r.status === 409)!;
    expect(refused.headers.get('content-type')).toMatch(/^application\/problem\+json/);
    expect(refused.json.detail).toBe("the org's desktop quota (3) would be exceeded: destroy desktops it no longer needs first");
    const made = five.filter((r) => r.status === 201);

    // A repeat of a create that succeeded answers its desktop, quota or not; another org is not held back.
    const repeat = await acme('POST', '/v1/desktops', { tier: 'small' }, { 'idempotency-key': `q-${five.indexOf(made[0]!)}` });
    expect(repeat.status).toBe(200);
    expect(repeat.json.id).toBe(made[0]!.json.id);
    expect((await other('POST', '/v1/desktops', { tier: 'small' })).status).toBe(201);

    const source = made[0]!.json.id as string;
    await until(async () => (await acme('GET', `/v1/desktops/${source}`)).json.state === 'hibernated', 10_000, 'the source to be placed');
    expect((await acme('POST', `/v1/desktops/${source}/fork`, { count: 1, acknowledge_shared_state: true })).status).toBe(409);

    // Destroying one makes room for one fork; that fork then fills the quota again.
    const gone = made[1]!.json.id as string;
    expect((await acme('POST', `/v1/desktops/${gone}/destroy?wait=true`)).json.state).toBe('succeeded');
    const fork = await acme('POST', `/v1/desktops/${source}/fork?wait=true`, { count: 1, acknowledge_shared_state: true });
    expect(fork.status, fork.text).toBe(200);
    expect(fork.json.state).toBe('succeeded');
    expect((await acme('POST', '/v1/desktops', { tier: 'small' })).status).toBe(409);
  });
});
