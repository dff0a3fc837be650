/**
 * The fleet, for real: one PostgreSQL, two `canto scheduler` processes and two `canto agent`
 * processes on the sandbox runtime, each with its own state directory and ports, on this machine.
 *
 * - Every route answers on the follower as on the leader: lifecycle mutations, guest operations,
 *   files, screens, input, stream tickets, port exposures through each replica's ingress,
 *   webhooks, usage, forks.
 * - The leader is killed (SIGSTOP, then SIGKILL) while ten wakes and hibernates are in flight:
 *   every request to the survivor is answered, every operation settles exactly once, every event
 *   is delivered (at least once, under one event id).
 * - An agent is frozen (SIGSTOP): exec on its desktop answers 503 within three seconds; past the
 *   grace period the desktop is force-hibernated; when the agent resumes, the desktop's processes
 *   are gone from the host before it reads ready again.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { generateSecretKey } from '../../scheduler/src/crypto/secret-box.js';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { readLease } from '../../scheduler/src/store/leases.js';
import { createSandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { freshDatabaseUrl } from '../helpers/db.js';
import { api, mintKey, readResponse, until } from '../helpers/scheduler.js';
import { crashTree, freePort, startAgentProcess, startSchedulerProcess, type Child } from '../helpers/processes.js';
import { startWebhookReceiver, type WebhookReceiver } from '../helpers/webhook-receiver.js';

const isRoot = process.getuid?.() === 0;
const APP = readFileSync(join(import.meta.dirname, '..', 'fixtures', 'guest-echo-app.mjs'));
const GRACE_MS = 6_000;

/** A GET through an ingress: fetch cannot set Host, which names the exposure. */
function viaIngress(port: number, host: string, path: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path, headers: { host }, agent: false }, (res) => {
      let body = '';
      res.on('data', (c: Buffer) => (body += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}

interface Replica extends Child {
  id: string;
  url: string;
  ingressPort: number;
}

describe.skipIf(!isRoot)('two schedulers, two agents, one machine', () => {
  const stateDirs = [mkdtempSync(join(tmpdir(), 'canto-fleet-a-')), mkdtempSync(join(tmpdir(), 'canto-fleet-b-'))];
  const children: Child[] = [];
  const replicas: Replica[] = [];
  const agents: Child[] = [];
  let databaseUrl: string;
  let secretKey: string;
  let sql: Sql;
  let key: string;
  let receiver: WebhookReceiver;

  async function startReplica(id: string, ingressPort?: number): Promise<Replica> {
    const port = await freePort();
    const ingress = ingressPort ?? (await freePort());
    const child = await startSchedulerProcess({
      databaseUrl,
      port,
      secretKey,
      extra: {
        CANTO_REPLICA_ID: id,
        // The defaults under test: lease TTL 2.5 s, renewal 0.5 s, heartbeat 1 s, down after 2.25 s.
        CANTO_LEASE_TTL_MS: '',
        CANTO_LEASE_RENEW_MS: '',
        CANTO_ENGINE_POLL_MS: '',
        CANTO_HOST_FAILURE_GRACE_MS: String(GRACE_MS),
        CANTO_INGRESS_BASE_URL: 'http://apps.fleet.test',
        CANTO_INGRESS_LISTEN: `127.0.0.1:${ingress}`,
        CANTO_WEBHOOK_ALLOW_LOOPBACK: 'true',
        CANTO_WEBHOOK_RETRY_BASE_MS: '200',
      },
    });
    children.push(child);
    const replica = Object.assign(child, { id, ingressPort: ingress });
    replicas.push(replica);
    return replica;
  }

  async function leaderAndFollower(): Promise<[Replica, Replica]> {
    const live = replicas.filter((r) => r.proc.exitCode === null && r.proc.signalCode === null);
    const holder = await until(async () => {
      const lease = await readLease(sql, 'leader');
      return lease?.live && live.some((r) => r.id === lease.holder) ? lease.holder : null;
    }, 10_000, 'a leader');
    const leader = live.find((r) => r.id === holder)!;
    return [leader, live.find((r) => r !== leader)!];
  }

  async function agentLinks(replica: Replica): Promise<number> {
    const text = await (await fetch(`${replica.url}/metrics`)).text();
    return Number(/^canto_agent_links (\d+)/m.exec(text)?.[1] ?? 0);
  }

  beforeAll(async () => {
    databaseUrl = await freshDatabaseUrl();
    secretKey = generateSecretKey();
    sql = connectDatabase(databaseUrl, { max: 2 });
    receiver = await startWebhookReceiver();
    const a = await startReplica('replica-a');
    const b = await startReplica('replica-b');
    // Each agent is given one replica; it finds the other through it.
    for (const [i, replica] of [a, b].entries()) {
      const agent = startAgentProcess(replica.url, stateDirs[i]!, { CANTO_AGENT_RECONNECT_MAX_MS: '' });
      agents.push(agent);
      children.push(agent);
    }
    await until(async () => (await agentLinks(a)) === 2 && (await agentLinks(b)) === 2, 30_000, 'both agents linked to both replicas');
    key = await mintKey(databaseUrl, 'fleet');
  }, 120_000);

  afterAll(async () => {
    for (const c of children) {
      c.proc.kill('SIGCONT');
      await c.kill('SIGKILL');
    }
    await receiver?.close();
    await sql?.end();
    for (const dir of stateDirs) {
      if (existsSync(join(dir, 'runtime'))) {
        const cleaner = await createSandboxDriver({ stateDir: join(dir, 'runtime') });
        for (const d of await cleaner.list()) await cleaner.destroy(d.desktopId);
        await cleaner.close();
      }
      rmSync(dir, { recursive: true, force: true });
    }
  }, 120_000);

  const settled = (state: string) => state === 'succeeded' || state === 'failed';

  it('answers every route on the follower as on the leader', async () => {
    const [leader, follower] = await leaderAndFollower();
    const f = api(follower.url, key);
    const created = await f('POST', '/v1/desktops', { tier: 'small' });
    expect(created.status, created.text).toBe(201);
    const id: string = created.json.id;
    const woke = await f('POST', `/v1/desktops/${id}/wake?wait=true`);
    expect(woke.status, woke.text).toBe(200);
    expect(woke.json.state).toBe('succeeded');
    const auth = { authorization: `Bearer ${key}` };
    expect((await fetch(`${follower.url}/v1/desktops/${id}/files/root/app.mjs`, { method: 'PUT', headers: auth, body: APP })).status).toBe(204);
    expect((await f('POST', `/v1/desktops/${id}/exec`, { command: 'setsid node /root/app.mjs 8000 >/root/app.log 2>&1 </dev/null &' })).status).toBe(200);
    await until(async () => (await f('POST', `/v1/desktops/${id}/exec`, { command: 'grep -q listening /root/app.log' })).json.exit_code === 0, 10_000, 'the app');

    for (const replica of [leader, follower]) {
      const c = api(replica.url, key);
      const tag = replica.id;
      const expectStatus = (res: { status: number; text: string }, status: number, what: string) => expect(res.status, `${tag} ${what}: ${res.text}`).toBe(status);
      expectStatus(await c('GET', '/v1/desktops'), 200, 'list');
      expectStatus(await c('GET', `/v1/desktops/${id}`), 200, 'get');
      expectStatus(await c('PATCH', `/v1/desktops/${id}`, { idle_timeout_secs: 0 }), 200, 'patch');
      expectStatus(await c('GET', `/v1/operations/${woke.json.id}`), 200, 'operation');
      expectStatus(await c('GET', '/v1/usage'), 200, 'usage');
      const exec = await c('POST', `/v1/desktops/${id}/exec`, { command: `echo ${tag}` });
      expectStatus(exec, 200, 'exec');
      expect(exec.json.stdout).toBe(`${tag}\n`);
      const spawned = await c('POST', `/v1/desktops/${id}/exec`, { command: 'echo detached', detached: true });
      expectStatus(spawned, 202, 'detached exec');
      expectStatus(await c('GET', `/v1/desktops/${id}/processes/${spawned.json.process_id}`), 200, 'process');
      const file = `/v1/desktops/${id}/files/root/${tag}.txt`;
      expect((await fetch(replica.url + file, { method: 'PUT', headers: auth, body: tag })).status).toBe(204);
      expect(await (await fetch(replica.url + file, { headers: auth })).text()).toBe(tag);
      expectStatus(await c('GET', `/v1/desktops/${id}/files-meta/root/${tag}.txt`), 200, 'stat');
      expectStatus(await c('GET', `/v1/desktops/${id}/dir/root`), 200, 'list dir');
      expectStatus(await c('DELETE', `/v1/desktops/${id}/files/root/${tag}.txt`), 204, 'delete');
      const shot = await fetch(`${replica.url}/v1/desktops/${id}/screenshot`, { method: 'POST', headers: auth });
      expect(shot.status).toBe(200);
      expect(shot.headers.get('content-type')).toBe('image/png');
      expectStatus(await c('POST', `/v1/desktops/${id}/input`, { actions: [{ type: 'mouse_move', x: 10, y: 10 }] }), 200, 'input');
      expectStatus(await c('GET', `/v1/desktops/${id}/display`), 200, 'display');
      expectStatus(await c('PUT', `/v1/desktops/${id}/display`, { width: 1024, height: 768 }), 200, 'resize');
      expectStatus(await c('POST', `/v1/desktops/${id}/stream`, { claim: 'view' }), 201, 'stream ticket');
      const exposed = await c('POST', `/v1/desktops/${id}/ports`, { port: 8000, public: true });
      expectStatus(exposed, 201, 'expose');
      expectStatus(await c('GET', `/v1/desktops/${id}/ports`), 200, 'list ports');
      // Every replica's ingress reaches the app, whichever replica created the exposure.
      for (const through of [leader, follower]) {
        const res = await viaIngress(through.ingressPort, `8000-${id}.apps.fleet.test`, `/via-${tag}`);
        expect(res.status, `${through.id}'s ingress: ${res.body}`).toBe(200);
        expect((JSON.parse(res.body) as { url: string }).url).toBe(`/via-${tag}`);
      }
      expectStatus(await c('DELETE', `/v1/desktops/${id}/ports/8000`), 204, 'unexpose');
      const hook = await c('POST', '/v1/webhooks', { url: `${receiver.origin}/route-check`, events: ['desktop.woken'] });
      expectStatus(hook, 201, 'webhook');
      expectStatus(await c('GET', '/v1/webhooks'), 200, 'list webhooks');
      expectStatus(await c('GET', `/v1/webhooks/${hook.json.id}/deliveries`), 200, 'deliveries');
      expectStatus(await c('DELETE', `/v1/webhooks/${hook.json.id}`), 204, 'unhook');
    }
    // Reads agree.
    const [l, fo] = await Promise.all([api(leader.url, key)('GET', `/v1/desktops/${id}`), f('GET', `/v1/desktops/${id}`)]);
    expect(fo.text).toBe(l.text);

    // Lifecycle through the follower: hibernate, fork, destroy.
    expect((await f('POST', `/v1/desktops/${id}/hibernate?wait=true`)).json.state).toBe('succeeded');
    const forked = await f('POST', `/v1/desktops/${id}/fork?wait=true`, { count: 1, acknowledge_shared_state: true });
    expect(forked.status, forked.text).toBe(200);
    for (const d of [id, ...forked.json.result.desktop_ids]) {
      expect((await f('POST', `/v1/desktops/${d}/destroy?wait=true`)).json.state).toBe('succeeded');
    }
  }, 180_000);

  it('kill -9 of the leader during ten wakes and hibernates: survivors answer, every operation settles once, no event is lost', async () => {
    const [leader, survivor] = await leaderAndFollower();
    const s = api(survivor.url, key);
    expect((await s('POST', '/v1/webhooks', { url: `${receiver.origin}/events`, events: ['desktop.created', 'desktop.woken', 'desktop.hibernated', 'desktop.destroyed'] })).status).toBe(201);
    const ids: string[] = [];
    for (let i = 0; i < 10; i++) ids.push((await s('POST', '/v1/desktops', { tier: 'small' })).json.id);
    const toHibernate = ids.slice(0, 5);
    const toWake = ids.slice(5);
    for (const id of toHibernate) expect((await s('POST', `/v1/desktops/${id}/wake?wait=true`)).json.state).toBe('succeeded');
    await until(async () => {
      const states = await Promise.all(toWake.map(async (id) => (await s('GET', `/v1/desktops/${id}`)).json.state));
      return states.every((st) => st === 'hibernated');
    }, 30_000, 'the others to be placed');

    // A desktop to keep serving guest operations through the gap.
    const steady: string = (await s('POST', '/v1/desktops', { tier: 'small' })).json.id;
    expect((await s('POST', `/v1/desktops/${steady}/wake?wait=true`)).json.state).toBe('succeeded');

    const ops: string[] = [];
    for (const id of toHibernate) ops.push((await s('POST', `/v1/desktops/${id}/hibernate`)).json.id);
    for (const id of toWake) ops.push((await s('POST', `/v1/desktops/${id}/wake`)).json.id);
    await until(async () => (await sql`SELECT count(*)::int AS n FROM operations WHERE id = ANY(${ops}) AND state = 'running'`)[0]!.n > 0, 10_000, 'the leader to run them');

    const killedAt = Date.now();
    crashTree(leader.proc.pid!);
    await leader.kill('SIGKILL');

    // Through the gap, every request to the survivor is answered, mutations included.
    const answers: Array<{ what: string; status: number; at: number }> = [];
    let queued: string | null = null;
    const probe = async () => {
      for (let i = 0; Date.now() - killedAt < 6_000; i++) {
        const read = await s('GET', '/v1/desktops');
        answers.push({ what: 'list', status: read.status, at: Date.now() - killedAt });
        const exec = await s('POST', `/v1/desktops/${steady}/exec`, { command: 'true' });
        answers.push({ what: 'exec', status: exec.status, at: Date.now() - killedAt });
        if (i === 2) {
          const created = await s('POST', '/v1/desktops', { tier: 'small' });
          answers.push({ what: 'create', status: created.status, at: Date.now() - killedAt });
          const wake = await s('POST', `/v1/desktops/${created.json.id}/wake`);
          answers.push({ what: 'wake', status: wake.status, at: Date.now() - killedAt });
          queued = wake.json.id;
        }
        await new Promise((r) => setTimeout(r, 100));
      }
    };
    let firstSettledMs = -1;
    const watch = async () => {
      await until(async () => {
        // Some may have settled before the kill; the survivor's first is the measure.
        const [row] = await sql`
          SELECT count(*)::int AS n, count(*) FILTER (WHERE settled_at > to_timestamp(${killedAt / 1000}))::int AS after
          FROM operations WHERE id = ANY(${ops}) AND state IN ('succeeded', 'failed')`;
        if (row!.after > 0 && firstSettledMs < 0) firstSettledMs = Date.now() - killedAt;
        return row!.n === 10;
      }, 60_000, 'every operation to settle').catch(async (err: Error) => {
        const open = await sql`SELECT o.id, o.kind, o.state, o.attempts, o.error, d.state AS desktop_state, d.host_id FROM operations o JOIN desktops d ON d.id = o.desktop_id WHERE o.id = ANY(${ops})`;
        throw new Error(`${err.message}: ${JSON.stringify(open)}`);
      });
    };
    await Promise.all([probe(), watch()]);
    const failed = answers.filter((a) => a.status >= 500);
    expect(failed, JSON.stringify(failed)).toEqual([]);
    console.log(`leader killed: first operation settled by the survivor after ${firstSettledMs} ms; ${answers.length} requests to the survivor during the gap, none failed`);
    if (firstSettledMs > 0) expect(firstSettledMs).toBeLessThan(5_000);

    const rows = await sql<Array<{ id: string; desktop_id: string; kind: string; state: string }>>`SELECT id, desktop_id, kind, state FROM operations WHERE id = ANY(${ops})`;
    expect(rows.map((r) => r.state)).toEqual(Array(10).fill('succeeded'));
    for (const id of toHibernate) expect((await s('GET', `/v1/desktops/${id}`)).json.state).toBe('hibernated');
    for (const id of toWake) expect((await s('GET', `/v1/desktops/${id}`)).json.state).toBe('awake');
    // The wake accepted during the gap settles too.
    expect(queued).not.toBeNull();
    await until(async () => settled((await s('GET', `/v1/operations/${queued}`)).json.state), 30_000, 'the queued wake');
    expect((await s('GET', `/v1/operations/${queued}`)).json.state).toBe('succeeded');

    // Exactly one event per transition, and each reached the endpoint under its event id.
    const events = await sql<Array<{ desktop_id: string; type: string; payload: { eventId: string } }>>`
      SELECT desktop_id, type, payload FROM outbox WHERE desktop_id = ANY(${ids}) ORDER BY id`;
    for (const id of toHibernate) expect(events.filter((e) => e.desktop_id === id).map((e) => e.type)).toEqual(['desktop.created', 'desktop.woken', 'desktop.hibernated']);
    for (const id of toWake) expect(events.filter((e) => e.desktop_id === id).map((e) => e.type)).toEqual(['desktop.created', 'desktop.woken']);
    const expected = new Set(events.map((e) => e.payload.eventId));
    const delivered = await until(() => {
      const seen = new Map<string, Set<string>>();
      for (const r of receiver.at('/events')) {
        const eventId = (JSON.parse(r.body) as { eventId: string }).eventId;
        seen.set(eventId, (seen.get(eventId) ?? new Set()).add(String(r.headers['svc-webhook-id'])));
      }
      return [...expected].every((e) => seen.has(e)) ? seen : null;
    }, 60_000, 'every event delivered');
    // At least once, never under two delivery ids.
    for (const e of expected) expect(delivered.get(e)!.size).toBe(1);
  }, 240_000);

  it('a frozen agent: 503 within three seconds, forced hibernation past the grace, its processes gone when it resumes', async () => {
    const [leader] = await leaderAndFollower();
    const c = api(leader.url, key);
    const id: string = (await c('POST', '/v1/desktops', { tier: 'small' })).json.id;
    expect((await c('POST', `/v1/desktops/${id}/wake?wait=true`)).json.state).toBe('succeeded');
    const desktop = (await c('GET', `/v1/desktops/${id}`)).json;
    const [host] = await sql<Array<{ id: string }>>`SELECT id FROM hosts WHERE id = ${desktop.host_id}`;
    expect(host).toBeDefined();
    const index = stateDirs.findIndex((dir) => existsSync(join(dir, 'runtime', 'desktops', id)));
    expect(index).toBeGreaterThanOrEqual(0);
    const agent = agents[index]!;
    const init = JSON.parse(readFileSync(join(stateDirs[index]!, 'runtime', 'desktops', id, 'run', 'init.json'), 'utf8')) as { pid: number };
    expect(existsSync(`/proc/${init.pid}`)).toBe(true);

    agent.proc.kill('SIGSTOP');
    const frozenAt = Date.now();
    const first = await c('POST', `/v1/desktops/${id}/exec`, { command: 'sleep 1; echo late' });
    const firstMs = Date.now() - frozenAt;
    expect(first.status, first.text).toBe(503);
    expect(first.headers.get('retry-after')).toMatch(/^\d+$/);
    expect(firstMs).toBeLessThan(3_000);
    const t1 = Date.now();
    expect((await c('POST', `/v1/desktops/${id}/exec`, { command: 'true' })).status).toBe(503);
    expect(Date.now() - t1).toBeLessThan(500);
    await until(async () => (await c('GET', `/v1/desktops/${id}`)).json.host_status === 'down', 5_000, 'the host to read down');
    const downMs = Date.now() - frozenAt;
    console.log(`frozen agent: exec answered 503 after ${firstMs} ms; host read down after ${downMs} ms`);

    const forced = await until(async () => {
      const d = (await c('GET', `/v1/desktops/${id}`)).json;
      return d.state === 'hibernated' ? d : null;
    }, GRACE_MS + 10_000, 'forced hibernation');
    expect(forced.generation).toBeGreaterThan(desktop.generation);
    // The desktop still runs on the frozen host: its agent could not be told.
    expect(existsSync(`/proc/${init.pid}`)).toBe(true);

    agent.proc.kill('SIGCONT');
    await until(async () => (await c('GET', `/v1/desktops/${id}`)).json.host_status === 'ready', 20_000, 'the host to read ready');
    expect(existsSync(`/proc/${init.pid}`)).toBe(false);
    const cgroup = `/sys/fs/cgroup/pids/canto/${id}/cgroup.procs`;
    expect(existsSync(cgroup) ? readFileSync(cgroup, 'utf8').trim() : '').toBe('');
    const rewoke = await c('POST', `/v1/desktops/${id}/wake?wait=true`);
    expect(rewoke.status, rewoke.text).toBe(200);
    expect((await c('POST', `/v1/desktops/${id}/exec`, { command: 'echo back' })).json.stdout).toBe('back\n');
    expect((await readResponse(await fetch(`${leader.url}/readyz`))).status).toBe(200);
  }, 120_000);
});
