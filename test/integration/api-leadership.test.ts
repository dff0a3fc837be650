/**
 * Two schedulers on one database (SPEC 4.1 "503 node is not the leader", SPEC 7): exactly one
 * leads; the follower serves reads but answers lifecycle mutations with 503 + Retry-After and
 * refuses agent links; when the leader goes away the follower takes over within the lease TTL
 * and then drives operations with the agents that reconnect to it.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { api, JOIN_TOKEN, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { expectProblem } from '../helpers/problem.js';

let first: TestScheduler;
let second: TestScheduler;
let leader: TestScheduler;
let follower: TestScheduler;
let key: string;
let agent: TestAgent | undefined;

beforeAll(async () => {
  first = await startTestScheduler();
  // Same database and the same sealing key: two replicas of one deployment.
  second = await startTestScheduler({ CANTO_SECRET_KEY: first.env.CANTO_SECRET_KEY! }, first.databaseUrl);
  key = await mintKey(first.databaseUrl, 'ha');
});

afterAll(async () => {
  await agent?.stop();
  await Promise.all([first?.close(), second?.close()]);
});

/** The status of a websocket upgrade to the agent link: 101 when accepted. */
function agentUpgrade(baseUrl: string, token: string | null): Promise<number> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`${baseUrl.replace(/^http/, 'ws')}/internal/agents/ws`, {
      headers: token === null ? {} : { authorization: `Bearer ${token}` },
    });
    ws.on('open', () => {
      ws.close();
      resolve(101);
    });
    ws.on('unexpected-response', (req, res) => {
      resolve(res.statusCode ?? 0);
      req.destroy();
    });
    ws.on('error', reject);
  });
}

describe('one leader, one follower', () => {
  let desktopId: string;

  it('exactly one replica leads', async () => {
    await until(() => first.leadership.isLeader() !== second.leadership.isLeader(), 5_000, 'one leader');
    [leader, follower] = first.leadership.isLeader() ? [first, second] : [second, first];
    expect(leader.leadership.isLeader()).toBe(true);
    expect(follower.leadership.isLeader()).toBe(false);
  });

  it('the follower answers wake, hibernate and destroy with 503, Retry-After and problem+json', async () => {
    const f = api(follower.url, key);
    desktopId = (await api(leader.url, key)('POST', '/v1/desktops', { tier: 'small' })).json.id;
    for (const kind of ['wake', 'hibernate', 'destroy']) {
      for (const suffix of ['', '?wait=true']) {
        const res = await f('POST', `/v1/desktops/${desktopId}/${kind}${suffix}`, {}, { 'idempotency-key': `k-${kind}` });
        expectProblem(res, 503, `${kind}${suffix}`);
        const retryAfter = res.headers.get('retry-after');
        expect(retryAfter, `${kind} Retry-After`).toMatch(/^\d+$/);
        expect(Number(retryAfter)).toBeGreaterThanOrEqual(1);
      }
    }
    // Nothing was recorded for the refused requests.
    const d = await f('GET', `/v1/desktops/${desktopId}`);
    expect(d.json).toMatchObject({ state: 'provisioning', generation: 0 });
  });

  it('the leader accepts the same mutation', async () => {
    // A stale generation records a failed operation without leaving work in flight.
    const res = await api(leader.url, key)('POST', `/v1/desktops/${desktopId}/wake`, { expected_generation: 9 });
    expectProblem(res, 409);
    expect(res.json.operation_id).toMatch(/^op_/);
    const hib = await api(leader.url, key)('POST', `/v1/desktops/${desktopId}/hibernate`);
    expectProblem(hib, 409);
  });

  it('reads work on both replicas and agree', async () => {
    const opId = (await api(leader.url, key)('POST', `/v1/desktops/${desktopId}/destroy`, { expected_generation: 9 })).json.operation_id;
    const bodies: string[][] = [];
    for (const replica of [leader, follower]) {
      const c = api(replica.url, key);
      const got = await Promise.all([
        c('GET', '/v1/desktops'),
        c('GET', `/v1/desktops/${desktopId}`),
        c('GET', '/v1/desktops?state=provisioning'),
        c('GET', `/v1/operations/${opId}`),
        c('GET', '/v1/usage'),
      ]);
      for (const r of got) expect(r.status, r.text).toBe(200);
      expect(got[3]!.json).toMatchObject({ id: opId, state: 'failed', kind: 'destroy' });
      bodies.push(got.slice(0, 4).map((r) => r.text));
    }
    expect(bodies[1]).toEqual(bodies[0]);
  });

  it('agent links: the follower refuses (503), the leader accepts, a bad join token is 401 everywhere', async () => {
    expect(await agentUpgrade(follower.url, JOIN_TOKEN)).toBe(503);
    expect(await agentUpgrade(leader.url, JOIN_TOKEN)).toBe(101);
    for (const replica of [leader, follower]) {
      expect(await agentUpgrade(replica.url, 'wrong-token')).toBe(401);
      expect(await agentUpgrade(replica.url, null)).toBe(401);
    }
  });
});

describe('agents given every replica', () => {
  it('find the leader past a refusing follower', async () => {
    const roaming = await startFakeAgent(`${follower.url},${leader.url}`);
    try {
      expect(leader.agents.connectedHostIds()).toContain(roaming.hostId);
      expect(follower.agents.connectedHostIds()).not.toContain(roaming.hostId);
    } finally {
      await roaming.stop();
    }
  });
});

describe('failover', () => {
  it('closing the leader makes the follower lead within the lease TTL, and it then accepts mutations', async () => {
    const desktopId = (await api(follower.url, key)('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
    // An agent dialing the follower is refused until the follower leads, then gets in.
    agent = await startFakeAgent(follower.url, { waitConnected: false });
    expect(follower.agents.connectedHostIds()).toEqual([]);

    const ttlMs = Number(leader.env.CANTO_LEASE_TTL_MS);
    const closed = Date.now();
    await leader.close();
    await until(() => follower.leadership.isLeader(), ttlMs, 'the follower to lead');
    expect(Date.now() - closed).toBeLessThan(ttlMs + 1_000);

    await agent.waitConnected(5_000);
    const c = api(follower.url, key);
    const wake = await c('POST', `/v1/desktops/${desktopId}/wake?wait=true`);
    expect(wake.status, wake.text).toBe(200);
    expect(wake.json).toMatchObject({ kind: 'wake', state: 'succeeded' });
    expect((await c('GET', `/v1/desktops/${desktopId}`)).json).toMatchObject({ state: 'awake', host_id: agent.hostId });
  });
});
