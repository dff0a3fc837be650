/**
 * Failover and host-failure detection, with default settings (lease TTL 2.5 s, renewal 0.5 s,
 * heartbeat 1 s, host down after 2.25 s): two `canto scheduler` processes and one agent on the
 * sandbox runtime, on a database of their own.
 *
 * - kill → first accepted request: the leader is killed (SIGSTOP, SIGKILL); a client that was
 *   talking to it retries on the survivor. Baseline: the same request while both run.
 * - kill → first settled wake: a wake sent to the survivor right after the kill, until it settles.
 *   Baseline: the same wake on a healthy fleet.
 * - clean stop → follower leads: SIGTERM to the leader. Baseline: one lease renewal interval.
 * - frozen host → exec answers 503, and → host reads down: the agent is stopped (SIGSTOP) and an
 *   exec is sent at once. Baseline: CANTO_HOST_DOWN_MS, the detection limit.
 */
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { readLease } from '../../scheduler/src/store/leases.js';
import { generateSecretKey } from '../../scheduler/src/crypto/secret-box.js';
import { createApiKey } from '../../scheduler/src/services/keys.js';
import { crashTree, freePort, startAgentProcess, startSchedulerProcess, type Child } from '../helpers/processes.js';
import { median, table, timed } from './stats.js';
import { until } from '../helpers/wait.js';

export interface FailoverBenchOptions {
  /** A PostgreSQL server URL; the bench makes a database of its own on it. */
  databaseUrl: string;
  stateDir: string;
  runs: number;
}

type Scheduler = Child & { url: string; id: string };

const DEFAULTS = { CANTO_LEASE_TTL_MS: '', CANTO_LEASE_RENEW_MS: '', CANTO_ENGINE_POLL_MS: '', CANTO_LOG_LEVEL: 'warn' };
const HOST_DOWN_MS = 2_250;
const RENEW_MS = 500;


export async function benchFailover(options: FailoverBenchOptions): Promise<void> {
  const runs = Math.max(5, Math.min(options.runs, 7));
  const admin = connectDatabase(options.databaseUrl, { max: 1 });
  const name = `failover_${Date.now()}`;
  await admin.unsafe(`CREATE DATABASE ${name}`);
  await admin.end();
  const databaseUrl = options.databaseUrl.replace(/\/[^/?]+\?/, `/${name}?`);
  const secretKey = generateSecretKey();
  const children: Child[] = [];
  const schedulers = new Map<string, Scheduler>();
  // A replica comes back where it was, as a restarted service does: agents find it again there.
  const ports = new Map<string, number>();
  const start = async (id: string): Promise<Scheduler> => {
    const port = ports.get(id) ?? (await freePort());
    ports.set(id, port);
    const child = await startSchedulerProcess({ databaseUrl, port, secretKey, extra: { ...DEFAULTS, CANTO_REPLICA_ID: id } });
    children.push(child);
    const s = Object.assign(child, { id });
    schedulers.set(id, s);
    return s;
  };
  let sql: Sql | null = null;
  try {
    const a = await start('bench-a');
    await start('bench-b');
    sql = connectDatabase(databaseUrl, { max: 2 });
    const db = sql;
    const agent = startAgentProcess(a.url, options.stateDir, { CANTO_LOG_LEVEL: 'warn', CANTO_AGENT_RECONNECT_MAX_MS: '' });
    children.push(agent);
    const key = (await createApiKey(db, 'failover')).key;
    const headers = { authorization: `Bearer ${key}`, 'content-type': 'application/json' };
    const post = (base: string, path: string, body: unknown = {}) =>
      fetch(base + path, { method: 'POST', headers, body: JSON.stringify(body) }).then(async (r) => ({ status: r.status, json: (await r.json()) as { id: string; state: string; stdout?: string } }));
    const get = (base: string, path: string) => fetch(base + path, { headers }).then(async (r) => (await r.json()) as { state: string; host_status?: string });
    const roles = async (): Promise<[Scheduler, Scheduler]> => {
      const holder = await until(async () => {
        const lease = await readLease(db, 'leader');
        return lease?.live && schedulers.get(lease.holder)?.proc.exitCode === null ? lease.holder : null;
      }, 15_000, 'a leader');
      const leader = schedulers.get(holder)!;
      return [leader, [...schedulers.values()].find((s) => s !== leader)!];
    };
    const linkedToBoth = () =>
      until(async () => {
        const counts = await Promise.all([...schedulers.values()].map(async (s) => Number(/^canto_agent_links (\d+)/m.exec(await (await fetch(`${s.url}/metrics`)).text())?.[1] ?? 0)));
        return counts.every((n) => n === 1);
      }, 30_000, 'the agent linked to both replicas');
    await linkedToBoth();

    const [first] = await roles();
    const desktop = (await post(first.url, '/v1/desktops', { tier: 'small' })).json.id;
    const settle = async (base: string, opId: string) =>
      until(async () => {
        const op = await get(base, `/v1/operations/${opId}`);
        return op.state === 'succeeded' || op.state === 'failed' ? op : null;
      }, 60_000, 'the operation to settle');
    const hibernated = async (base: string) => until(async () => (await get(base, `/v1/desktops/${desktop}`)).state === 'hibernated', 60_000, 'placement');
    await hibernated(first.url);

    const accepted: number[] = [];
    const acceptedBase: number[] = [];
    const settledWake: number[] = [];
    const wakeBase: number[] = [];
    for (let i = 0; i < runs; i++) {
      const [leader, follower] = await roles();
      await linkedToBoth();
      acceptedBase.push(await timed(() => post(follower.url, '/v1/desktops', { tier: 'small' })));
      wakeBase.push(await timed(async () => settle(follower.url, (await post(follower.url, `/v1/desktops/${desktop}/wake`)).json.id)));
      await settle(follower.url, (await post(follower.url, `/v1/desktops/${desktop}/hibernate`)).json.id);

      crashTree(leader.proc.pid!);
      const killedAt = performance.now();
      // A client that was talking to the leader moves to the survivor and is answered.
      await until(async () => (await post(follower.url, '/v1/desktops', { tier: 'small' }).catch(() => ({ status: 0 }))).status === 201, 30_000, 'an accepted request');
      accepted.push(performance.now() - killedAt);
      const wake = await post(follower.url, `/v1/desktops/${desktop}/wake`);
      const op = await settle(follower.url, wake.json.id);
      if (op.state !== 'succeeded') throw new Error(`wake after failover: ${JSON.stringify(op)}`);
      settledWake.push(performance.now() - killedAt);
      await leader.kill('SIGKILL');
      schedulers.delete(leader.id);
      await start(leader.id);
      await settle(follower.url, (await post(follower.url, `/v1/desktops/${desktop}/hibernate`)).json.id);
      process.stderr.write(`failover run ${i + 1}/${runs}\r`);
    }

    const handover: number[] = [];
    for (let i = 0; i < runs; i++) {
      const [leader, follower] = await roles();
      await linkedToBoth();
      const stoppedAt = performance.now();
      const stopping = leader.kill('SIGTERM');
      await until(async () => (await readLease(db, 'leader'))?.holder === follower.id, 10_000, 'the follower to lead');
      handover.push(performance.now() - stoppedAt);
      await stopping;
      schedulers.delete(leader.id);
      await start(leader.id);
    }

    const [, survivor] = await roles();
    await post(survivor.url, `/v1/desktops/${desktop}/wake?wait=true`);
    const execOnFrozen: number[] = [];
    const downOnFrozen: number[] = [];
    for (let i = 0; i < runs; i++) {
      await until(async () => (await get(survivor.url, `/v1/desktops/${desktop}`)).host_status === 'ready', 30_000, 'the host ready');
      await until(async () => (await post(survivor.url, `/v1/desktops/${desktop}/exec`, { command: 'true' })).status === 200, 30_000, 'exec to work');
      agent.proc.kill('SIGSTOP');
      const frozenAt = performance.now();
      const exec = await post(survivor.url, `/v1/desktops/${desktop}/exec`, { command: 'sleep 1' });
      if (exec.status !== 503) throw new Error(`exec on a frozen host answered ${exec.status}`);
      execOnFrozen.push(performance.now() - frozenAt);
      await until(async () => (await get(survivor.url, `/v1/desktops/${desktop}`)).host_status === 'down', 10_000, 'the host down');
      downOnFrozen.push(performance.now() - frozenAt);
      agent.proc.kill('SIGCONT');
      process.stderr.write(`host failure run ${i + 1}/${runs}\r`);
    }

    table(`Failover with default settings (ms, ${runs} runs each; the leader is killed with SIGSTOP + SIGKILL)`, [
      ['kill → first accepted request (survivor)', median(accepted), median(acceptedBase), 'ms', 'no request to a survivor fails', accepted],
      ['kill → first settled wake (survivor)', median(settledWake), median(wakeBase), 'ms', '< 5000 ms', settledWake],
      ['clean stop → follower leads', median(handover), RENEW_MS, 'ms', '< 1000 ms', handover],
    ]);
    table(`Host failure detection (ms, ${runs} runs; the agent is frozen with SIGSTOP); baseline = CANTO_HOST_DOWN_MS`, [
      ['frozen → exec answers 503', median(execOnFrozen), HOST_DOWN_MS, 'ms', '< 3000 ms', execOnFrozen],
      ['frozen → host reads down', median(downOnFrozen), HOST_DOWN_MS, 'ms', '< 3000 ms', downOnFrozen],
    ]);
  } finally {
    for (const c of children) {
      c.proc.kill('SIGCONT');
      await c.kill('SIGTERM');
    }
    await sql?.end();
  }
}
