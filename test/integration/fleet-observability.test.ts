/**
 * Seeing the fleet, and stopping without hanging: `/healthz`, `/readyz` and `/metrics` on a real
 * scheduler and a real agent; lease epochs that only grow and fence settlements; a scheduler that
 * stops with a `?wait=true` in flight answers it at once and is gone well within five seconds.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { acquireLease, releaseLease } from '../../scheduler/src/store/leases.js';
import { insertOperation, settleOperation } from '../../scheduler/src/store/operations.js';
import { api, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { freshDatabaseUrl } from '../helpers/db.js';
import { formatFleetStatus, readFleetStatus } from '../../cli/src/status.js';

/** One sample's value from Prometheus text, by metric name and a label subset. */
function sample(text: string, name: string, labels: Record<string, string> = {}): number | null {
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue;
    if (!Object.entries(labels).every(([k, v]) => line.includes(`${k}="${v}"`))) continue;
    return Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return null;
}

describe('probes and metrics', () => {
  let s: TestScheduler;
  let agent: TestAgent;
  let call: ReturnType<typeof api>;

  beforeAll(async () => {
    s = await startTestScheduler();
    agent = await startFakeAgent(s.url);
    call = api(s.url, await mintKey(s.databaseUrl, 'probes'));
  });

  afterAll(async () => {
    await agent?.stop();
    await s?.close();
  });

  it('answers /healthz and /readyz without a credential, outside the OpenAPI document', async () => {
    const health = await fetch(`${s.url}/healthz`);
    expect(health.status).toBe(200);
    expect(await health.json()).toEqual({ status: 'ok' });
    expect((await fetch(`${s.url}/readyz`)).status).toBe(200);
    const doc = (await call('GET', '/v1/openapi.json')).json;
    expect(Object.keys(doc.paths).filter((p: string) => !p.startsWith('/v1/'))).toEqual([]);
  });

  it('exports HTTP latency by route template, operations, links, leadership and database gauges', async () => {
    const id: string = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id;
    expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).status).toBe(200);
    await call('GET', `/v1/desktops/${id}`);
    const res = await fetch(`${s.url}/metrics`);
    expect(res.headers.get('content-type')).toMatch(/^text\/plain/);
    const text = await res.text();
    expect(sample(text, 'canto_http_request_duration_seconds_count', { route: '/v1/desktops/:id', method: 'GET', status_code: '200' })).toBeGreaterThanOrEqual(1);
    expect(text).not.toContain(id);
    expect(sample(text, 'canto_operations_settled_total', { kind: 'wake', outcome: 'succeeded' })).toBe(1);
    expect(sample(text, 'canto_operation_duration_seconds_count', { kind: 'wake' })).toBe(1);
    expect(sample(text, 'canto_agent_links')).toBe(1);
    expect(sample(text, 'canto_leader')).toBe(1);
    expect(sample(text, 'canto_lease_epoch')).toBe(s.leadership.term()!.epoch);
    expect(sample(text, 'canto_desktops', { state: 'awake' })).toBe(1);
    expect(sample(text, 'canto_hosts', { status: 'ready' })).toBe(1);
    expect(sample(text, 'canto_operations_open')).toBeNull();
    expect(sample(text, 'canto_webhook_deliveries_pending')).toBe(0);
    expect(sample(text, 'canto_replicas_live')).toBe(1);
    expect(sample(text, 'process_cpu_seconds_total')).toBeGreaterThan(0);
  });

  it('exports hosts with a drain by its state, so that a stopped drain can page someone', async () => {
    expect(sample(await (await fetch(`${s.url}/metrics`)).text(), 'canto_host_drains')).toBeNull();
    const sql = connectDatabase(s.databaseUrl, { max: 1 });
    try {
      // A drain that stopped on a failed move (the drainer leaves such a drain alone).
      await sql`UPDATE hosts SET drain_requested_at = now(), drain_error = 'the move of dsk_… failed' WHERE id = ${agent.hostId}`;
      const text = await (await fetch(`${s.url}/metrics`)).text();
      expect(sample(text, 'canto_host_drains', { state: 'stopped' })).toBe(1);
      expect(sample(text, 'canto_host_drains', { state: 'draining' })).toBeNull();
      // One that finished reads drained.
      await sql`UPDATE hosts SET drain_error = NULL, drain_finished_at = now() WHERE id = ${agent.hostId}`;
      const after = await (await fetch(`${s.url}/metrics`)).text();
      expect(sample(after, 'canto_host_drains', { state: 'drained' })).toBe(1);
      expect(sample(after, 'canto_host_drains', { state: 'stopped' })).toBeNull();
    } finally {
      await sql`UPDATE hosts SET drain_requested_at = NULL, drain_error = NULL, drain_finished_at = NULL WHERE id = ${agent.hostId}`;
      await sql.end();
    }
  });

  it("serves the agent's probes and metrics on its own listener", async () => {
    const base = `http://127.0.0.1:${agent.probePort}`;
    expect((await fetch(`${base}/healthz`)).status).toBe(200);
    const ready = await fetch(`${base}/readyz`);
    expect(ready.status).toBe(200);
    expect(((await ready.json()) as { linked: string[] }).linked).toHaveLength(1);
    const text = await (await fetch(`${base}/metrics`)).text();
    expect(sample(text, 'canto_agent_scheduler_links')).toBe(1);
    expect(sample(text, 'canto_agent_leader_epoch')).toBe(s.leadership.term()!.epoch);
    expect(sample(text, 'canto_agent_desktops', { running: 'true' })).toBe(1);
    expect(sample(text, 'canto_agent_command_duration_seconds_count', { command: 'desktop.start', outcome: 'ok' })).toBe(1);
  });

  it('an agent with no scheduler link is not ready', async () => {
    const lonely = await startFakeAgent('http://127.0.0.1:9', { waitConnected: false });
    try {
      const res = await fetch(`http://127.0.0.1:${lonely.probePort}/readyz`);
      expect(res.status).toBe(503);
    } finally {
      await lonely.stop();
    }
  });

  it('/readyz answers 503 when the database lacks a migration this build needs', async () => {
    const sql = connectDatabase(s.databaseUrl, { max: 1 });
    try {
      const [last] = await sql<Array<{ id: number; name: string }>>`SELECT id, name FROM schema_migrations ORDER BY id DESC LIMIT 1`;
      await sql`DELETE FROM schema_migrations WHERE id = ${last!.id}`;
      const res = await fetch(`${s.url}/readyz`);
      expect(res.status).toBe(503);
      expect(res.headers.get('content-type')).toBe('application/problem+json; charset=utf-8');
      expect(((await res.json()) as { detail: string }).detail).toContain(`needs ${last!.id}`);
      await sql`INSERT INTO schema_migrations (id, name) VALUES (${last!.id}, ${last!.name})`;
      expect((await fetch(`${s.url}/readyz`)).status).toBe(200);
    } finally {
      await sql.end();
    }
  });
});

describe('canto status', () => {
  it('lists both replicas, the leader and the host, and warns of replicas that disagree, drains that stopped and operations stuck open', async () => {
    const a = await startTestScheduler({ CANTO_REPLICA_ID: 'status-a', CANTO_INGRESS_BASE_URL: 'https://apps-a.example', CANTO_INGRESS_LISTEN: '127.0.0.1:0' });
    const b = await startTestScheduler(
      { CANTO_REPLICA_ID: 'status-b', CANTO_SECRET_KEY: a.env.CANTO_SECRET_KEY!, CANTO_INGRESS_BASE_URL: 'https://apps-b.example', CANTO_INGRESS_LISTEN: '127.0.0.1:0' },
      a.databaseUrl,
    );
    const agent = await startFakeAgent(a.url);
    const sql = connectDatabase(a.databaseUrl, { max: 1 });
    try {
      const leader = await until(() => (a.leadership.isLeader() ? 'status-a' : b.leadership.isLeader() ? 'status-b' : null), 5_000, 'a leader');
      const status = await until(async () => {
        const st = await readFleetStatus(sql);
        // The host reads ready once its host.ready arrives, a message after the agent linked.
        return st.replicas.filter((r) => r.role !== 'gone').length === 2 && st.hosts.every((h) => h.status === 'ready') ? st : null;
      }, 5_000, 'both replicas registered and the host ready');
      expect(status.replicas.map((r) => [r.id, r.role]).sort()).toEqual([['status-a', leader === 'status-a' ? 'leader' : 'follower'], ['status-b', leader === 'status-b' ? 'leader' : 'follower']]);
      expect(status.replicas.find((r) => r.id === 'status-a')!.url).toBe(a.advertisedUrl);
      expect(status.lease).toMatchObject({ holder: leader, live: true });
      expect(status.hosts).toEqual([expect.objectContaining({ id: agent.hostId, status: 'ready' })]);
      expect(status.warnings).toEqual([expect.stringMatching(/^replicas disagree on ingress_base_url \(.*https:\/\/apps-a\.example.*https:\/\/apps-b\.example/)]);
      // A secret differs only as fingerprints: the values never appear.
      await sql`UPDATE replicas SET settings = jsonb_set(settings, '{join_token}', '"sha256:000000000000"') WHERE id = 'status-b'`;
      const text = formatFleetStatus(await readFleetStatus(sql));
      expect(text).toMatch(/replicas disagree on join_token \(status-a: sha256:[0-9a-f]{12}; status-b: sha256:000000000000\)/);
      expect(text).not.toContain(a.env.CANTO_JOIN_TOKEN!);

      // A drain that stopped, and an operation open far longer than any takes, need a look.
      await sql`UPDATE replicas SET settings = (SELECT settings FROM replicas WHERE id = 'status-a') WHERE id = 'status-b'`;
      await sql`UPDATE hosts SET cordoned = true, drain_requested_at = now(), drain_error = 'move of dsk_x failed: the target ran out of disk' WHERE id = ${agent.hostId}`;
      const call = api(a.url, await mintKey(a.databaseUrl, 'status'));
      const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
      const [org] = await sql<Array<{ org_id: string }>>`SELECT org_id FROM desktops WHERE id = ${id}`;
      await sql`
        INSERT INTO operations (id, org_id, desktop_id, kind, state, from_state, reason, created_at)
        VALUES ('op_stuck0000000000000000000', ${org!.org_id}, ${id}, 'move', 'running', 'hibernated', 'admin', now() - interval '7 minutes')`;
      const looked = await readFleetStatus(sql);
      expect(looked.warnings).toEqual([
        `host ${agent.hostId} (${looked.hosts[0]!.hostname}): its drain stopped: move of dsk_x failed: the target ran out of disk; fix that, then run canto hosts drain ${agent.hostId} again`,
        `operation op_stuck0000000000000000000 (move of ${id}) has been running for 7 min`,
      ]);
      expect(formatFleetStatus(looked)).toMatch(new RegExp(`${agent.hostId}\\s+\\S+\\s+ready,cordoned,drain stopped\\s`));
    } finally {
      await sql.end();
      await agent.stop();
      await Promise.all([a.close(), b.close()]);
    }
  });
});

describe('lease epochs', () => {
  let sql: Sql;

  beforeAll(async () => {
    sql = connectDatabase(await freshDatabaseUrl(), { max: 2 });
  });

  afterAll(async () => {
    await sql.end();
  });

  it('grow with every term, and fence the settlements of an older one', async () => {
    const a = await acquireLease(sql, 'leader', 'a', 10_000);
    expect(a).toEqual({ held: true, epoch: 1 });
    expect(await acquireLease(sql, 'leader', 'a', 10_000)).toEqual({ held: true, epoch: 1 });
    expect((await acquireLease(sql, 'leader', 'b', 10_000)).held).toBe(false);
    await releaseLease(sql, 'leader', 'a');
    const b = await acquireLease(sql, 'leader', 'b', 10_000);
    expect(b).toEqual({ held: true, epoch: 2 });
    // A lapsed lease taken back by its old holder is a new term too.
    await sql`UPDATE leases SET expires_at = now() - interval '1 second'`;
    expect(await acquireLease(sql, 'leader', 'b', 10_000)).toEqual({ held: true, epoch: 3 });

    const [org] = await sql<Array<{ id: string }>>`INSERT INTO orgs (id, name) VALUES ('org_epochs', 'epochs') RETURNING id`;
    await sql`INSERT INTO desktops (id, org_id, tier, state, image_version, current_generation_id, idle_timeout_secs, billing_mode)
              VALUES ('dsk_epochsepochsepochsepoch', ${org!.id}, 'small', 'hibernated', 'debian-12', 'gen_x', 0, 'hourly')`;
    const op = await insertOperation(sql, { orgId: org!.id, desktopId: 'dsk_epochsepochsepochsepoch', kind: 'wake', idempotencyKey: null, fromState: 'hibernated' });
    await sql`UPDATE operations SET state = 'running' WHERE id = ${op.id}`;
    expect(await settleOperation(sql, op.id, { result: {} }, { holder: 'b', epoch: 2 })).toBe(false);
    expect(await settleOperation(sql, op.id, { result: {} }, { holder: 'a', epoch: 3 })).toBe(false);
    expect(await settleOperation(sql, op.id, { result: {} }, { holder: 'b', epoch: 3 })).toBe(true);
  });
});

describe('stopping', () => {
  it('answers a wait in flight at once and is gone within five seconds', async () => {
    const s = await startTestScheduler();
    let closed = false;
    try {
      const call = api(s.url, await mintKey(s.databaseUrl, 'stopping'));
      const id: string = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id;
      // No agent: the wake stays pending, and the wait would last the whole cap.
      const waiting = call('POST', `/v1/desktops/${id}/wake?wait=true`);
      await until(async () => (await call('GET', `/v1/desktops/${id}`)).json.state === 'waking', 5_000, 'the wake to be recorded');
      const t0 = Date.now();
      const closing = s.close().then(() => (closed = true));
      const answer = await waiting;
      expect(answer.status, answer.text).toBe(200);
      expect(answer.json).toMatchObject({ kind: 'wake' });
      expect(['pending', 'running']).toContain(answer.json.state);
      expect(Date.now() - t0, 'the wait answered at once').toBeLessThan(1_500);
      await closing;
      expect(Date.now() - t0).toBeLessThan(5_000);
    } finally {
      if (!closed) await s.close();
    }
  });
});
