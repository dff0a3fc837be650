/**
 * Two schedulers on one database: exactly one leads, and both serve every call. A follower records
 * lifecycle mutations as operations the leader's engine runs (no 503 while the database answers),
 * serves guest operations over its own link to the agent (agents learn every replica from the one
 * they reach), and answers `?wait=true` as the leader does. A stopping leader hands the lease over
 * at once; the new term's epoch reaches the agents, which then refuse the old term's commands.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { api, JOIN_TOKEN, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { expectProblem } from '../helpers/problem.js';
import { REFUSAL_HEADER, REPLICA_HEADER } from '../../shared/src/protocol.js';
import { connectDatabase } from '../../scheduler/src/store/db.js';
import { REPLICA_JOINED_CHANNEL } from '../../scheduler/src/fleet/registry.js';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import { startAgent, type AgentHandle } from '../../agent/src/channel.js';
import { loadAgentConfig } from '../../agent/src/config.js';
import { FakeDriver } from '../../agent/src/runtime/fake.js';

let first: TestScheduler;
let second: TestScheduler;
let leader: TestScheduler;
let follower: TestScheduler;
let key: string;
let agent: TestAgent;

beforeAll(async () => {
  first = await startTestScheduler({ CANTO_REPLICA_ID: 'replica-a' });
  // Same database and the same sealing key: two replicas of one deployment.
  second = await startTestScheduler({ CANTO_SECRET_KEY: first.env.CANTO_SECRET_KEY!, CANTO_REPLICA_ID: 'replica-b' }, first.databaseUrl);
  key = await mintKey(first.databaseUrl, 'ha');
  await until(() => first.leadership.isLeader() !== second.leadership.isLeader(), 5_000, 'one leader');
  [leader, follower] = first.leadership.isLeader() ? [first, second] : [second, first];
  // The agent is given the follower alone: it learns the leader from the hello reply.
  agent = await startFakeAgent(follower.url);
});

afterAll(async () => {
  await agent?.stop();
  await Promise.all([first?.close(), second?.close()]);
});

/** The status and headers of a websocket upgrade to the agent link. */
function agentUpgrade(baseUrl: string, token: string | null): Promise<{ status: number; headers: Record<string, unknown> }> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`${baseUrl.replace(/^http/, 'ws')}/internal/agents/ws`, {
      headers: token === null ? {} : { authorization: `Bearer ${token}` },
    });
    ws.on('upgrade', (res) => {
      resolve({ status: 101, headers: res.headers });
      setImmediate(() => ws.terminate());
    });
    ws.on('unexpected-response', (req, res) => {
      resolve({ status: res.statusCode ?? 0, headers: res.headers });
      req.destroy();
    });
    ws.on('error', reject);
  });
}

describe('every replica serves every call', () => {
  let desktopId: string;

  it('the agent links to both replicas, given only one', async () => {
    await until(() => leader.agents.isConnected(agent.hostId) && follower.agents.isConnected(agent.hostId), 5_000, 'links to both');
    // The agent counts a link once its hello reply is in and its fence applied, a moment later.
    await until(() => agent.linkedReplicas().length === 2, 5_000, 'the agent to count both');
    expect(agent.linkedReplicas().sort()).toEqual(['replica-a', 'replica-b']);
  });

  it('the follower records wake, hibernate and destroy, and the leader runs them', async () => {
    const f = api(follower.url, key);
    desktopId = (await f('POST', '/v1/desktops', { tier: 'small' })).json.id;
    const woke = await f('POST', `/v1/desktops/${desktopId}/wake?wait=true`, {}, { 'idempotency-key': 'w1' });
    expect(woke.status, woke.text).toBe(200);
    expect(woke.json).toMatchObject({ kind: 'wake', state: 'succeeded' });
    // The same key on the other replica is the same operation.
    expect((await api(leader.url, key)('POST', `/v1/desktops/${desktopId}/wake`, {}, { 'idempotency-key': 'w1' })).json.id).toBe(woke.json.id);
    const hibernate = await f('POST', `/v1/desktops/${desktopId}/hibernate`);
    expect(hibernate.status, hibernate.text).toBe(202);
    const settled = await until(async () => {
      const op = (await f('GET', `/v1/operations/${hibernate.json.id}`)).json;
      return op.state === 'succeeded' ? op : null;
    }, 5_000, 'the hibernate to settle');
    expect(settled.kind).toBe('hibernate');
    expect((await f('GET', `/v1/desktops/${desktopId}`)).json).toMatchObject({ state: 'hibernated', host_id: agent.hostId });
  });

  it('guest operations, display and stream tickets answer on the follower as on the leader', async () => {
    const f = api(follower.url, key);
    expect((await f('POST', `/v1/desktops/${desktopId}/wake?wait=true`)).status).toBe(200);
    for (const replica of [follower, leader]) {
      const c = api(replica.url, key);
      const exec = await c('POST', `/v1/desktops/${desktopId}/exec`, { command: 'echo hi' });
      expect(exec.status, exec.text).toBe(200);
      expect((await c('GET', `/v1/desktops/${desktopId}/display`)).status).toBe(200);
      const ticket = await c('POST', `/v1/desktops/${desktopId}/stream`, { claim: 'view' });
      expect(ticket.status, ticket.text).toBe(201);
    }
  });

  it('reads agree on both replicas', async () => {
    const bodies: string[][] = [];
    for (const replica of [leader, follower]) {
      const c = api(replica.url, key);
      const got = await Promise.all([c('GET', '/v1/desktops'), c('GET', `/v1/desktops/${desktopId}`), c('GET', '/v1/usage')]);
      for (const r of got) expect(r.status, r.text).toBe(200);
      bodies.push(got.slice(0, 2).map((r) => r.text));
    }
    expect(bodies[1]).toEqual(bodies[0]);
  });

  it('a replica that has just started serves guest calls at once: agents hear of it at once, and a call waits for the link', async () => {
    // It says it has joined, so the others read the registry at once rather than at their next refresh.
    const watcher = connectDatabase(first.databaseUrl, { max: 1 });
    const joined: string[] = [];
    await watcher.listen(REPLICA_JOINED_CHANNEL, (id) => void joined.push(id));
    const third = await startTestScheduler({ CANTO_SECRET_KEY: first.env.CANTO_SECRET_KEY!, CANTO_REPLICA_ID: 'replica-c' }, first.databaseUrl);
    try {
      // No wait for the agent to link: the first call may be served before it has.
      const exec = await api(third.url, key)('POST', `/v1/desktops/${desktopId}/exec`, { command: 'echo hi' });
      expect(exec.status, exec.text).toBe(200);
      expect(third.agents.isConnected(agent.hostId)).toBe(true);
      await until(() => joined.includes('replica-c'), 5_000, 'the join notification');
    } finally {
      await watcher.end();
      await third.close();
    }
  });

  it('agent links: every replica accepts and names itself; a bad join token is 401 everywhere', async () => {
    for (const replica of [leader, follower]) {
      const ok = await agentUpgrade(replica.url, JOIN_TOKEN);
      expect(ok.status).toBe(101);
      expect(ok.headers[REPLICA_HEADER]).toBe(replica === first ? 'replica-a' : 'replica-b');
      for (const token of ['wrong-token', null]) {
        const refused = await agentUpgrade(replica.url, token);
        expect(refused.status).toBe(401);
        expect(refused.headers[REFUSAL_HEADER]).toBe('bad-join-token');
      }
    }
  });
});

describe('a replica without a join token', () => {
  it("refuses agent links with 503 and says why, and the agent's log names that cause", async () => {
    const lonely = await startTestScheduler({ CANTO_JOIN_TOKEN: '' });
    const stateDir = mkdtempSync(join(tmpdir(), 'canto-no-token-'));
    const lines: string[] = [];
    const logger = pino({ level: 'info' }, { write: (line: string) => void lines.push(line) });
    let handle: AgentHandle | null = null;
    try {
      const refused = await agentUpgrade(lonely.url, JOIN_TOKEN);
      expect(refused.status).toBe(503);
      expect(refused.headers[REFUSAL_HEADER]).toBe('no-join-token');
      const config = loadAgentConfig({
        CANTO_SCHEDULER_URL: lonely.url,
        CANTO_AGENT_TOKEN: JOIN_TOKEN,
        CANTO_AGENT_STATE_DIR: stateDir,
        CANTO_AGENT_STREAM_LISTEN: 'off',
        CANTO_AGENT_INGRESS_LISTEN: 'off',
        CANTO_AGENT_TRANSFER_LISTEN: 'off',
        CANTO_AGENT_METRICS_LISTEN: 'off',
      });
      handle = await startAgent({ config, driver: new FakeDriver(), logger });
      await until(() => lines.some((l) => l.includes('CANTO_JOIN_TOKEN is unset there')), 5_000, 'the cause in the log');
      expect(lines.join('')).not.toContain('refused the join token');
      expect(lines.join('')).not.toContain(JOIN_TOKEN);
    } finally {
      await handle?.stop();
      await lonely.close();
      rmSync(stateDir, { recursive: true, force: true });
    }
  });
});

describe('handover', () => {
  it('a stopping leader hands over at once; the new term reaches the agent, and work goes on', async () => {
    const oldEpoch = leader.leadership.term()!.epoch;
    await until(() => agent.leaderEpoch() === oldEpoch, 5_000, 'the agent to know the epoch');
    const desktopId = (await api(follower.url, key)('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
    const stopped = Date.now();
    const closing = leader.close();
    await until(() => follower.leadership.isLeader(), 5_000, 'the follower to lead');
    expect(Date.now() - stopped).toBeLessThan(1_000);
    await closing;
    const term = follower.leadership.term()!;
    expect(term.epoch).toBeGreaterThan(oldEpoch);
    await until(() => agent.leaderEpoch() === term.epoch, 2_000, 'the new epoch to reach the agent');

    const c = api(follower.url, key);
    const wake = await c('POST', `/v1/desktops/${desktopId}/wake?wait=true`);
    expect(wake.status, wake.text).toBe(200);
    expect(wake.json).toMatchObject({ kind: 'wake', state: 'succeeded' });
    expect((await c('GET', `/v1/desktops/${desktopId}`)).json).toMatchObject({ state: 'awake', host_id: agent.hostId });
    expectProblem(await c('POST', `/v1/desktops/${desktopId}/wake`), 409);
  });
});
