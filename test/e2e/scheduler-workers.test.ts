/**
 * `canto scheduler` with two workers (CANTO_WORKERS=2), for real: the built CLI, one PostgreSQL,
 * a real agent on the sandbox runtime dialing the shared API port as its seed.
 *
 * - Each worker is a replica of its own (`<id>-w1`, `<id>-w2`) with an agent-link listener of
 *   its own; connections to the shared API port reach both (the agent link's upgrade names the
 *   replica that took it), and the agent, seeded with the shared port, links to both.
 * - A desktop is created, woken and exec'd through the shared port, one new connection per call,
 *   so the calls alternate between the workers: each serves guest operations over its own link.
 * - `/metrics` on any worker answers for both (the primary merges them).
 * - kill -9 of a worker: the API keeps answering through the other, the primary starts a new
 *   worker under the same replica id, and the agent links to it again.
 * - SIGTERM of the primary: it exits 0 and leaves no process of its tree behind.
 * - A worker that cannot start (its agent port is taken) fails the start: exit 1, naming the worker and the cause.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { execFile } from 'node:child_process';
import { request } from 'node:http';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import WebSocket from 'ws';
import { MALLOC_TUNABLES } from '../../shared/src/malloc-tunables.js';
import { REPLICA_HEADER } from '../../shared/src/protocol.js';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { destroyLeftDesktops } from '../helpers/sandbox.js';
import { generateSecretKey } from '../../scheduler/src/crypto/secret-box.js';
import { freshDatabaseUrl } from '../helpers/db.js';
import { JOIN_TOKEN, mintKey, until } from '../helpers/scheduler.js';
import { freePort, processTree, startAgentProcess, startSchedulerProcess, type Child } from '../helpers/processes.js';

const isRoot = process.getuid?.() === 0;
const REPLICAS = ['pool-w1', 'pool-w2'];

/** One call on a connection of its own: the cluster primary hands each new connection to the next worker. */
function freshCall(base: string, key: string, method: string, path: string, body?: unknown): Promise<{ status: number; json: any; text: string }> {
  const url = new URL(path, base);
  const payload = body === undefined ? undefined : JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const req = request(url, {
      method,
      agent: false,
      headers: { authorization: `Bearer ${key}`, ...(payload ? { 'content-type': 'application/json' } : {}) },
    }, (res) => {
      let text = '';
      res.on('data', (c: Buffer) => (text += c.toString()));
      res.on('end', () => {
        let json: any = null;
        try {
          json = JSON.parse(text);
        } catch {
          json = null;
        }
        resolve({ status: res.statusCode ?? 0, json, text });
      });
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(payload);
  });
}

/** The replica that takes an agent link at `base` (the upgrade response names it); the link is closed at once. */
function replicaAt(base: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`${base.replace(/^http/, 'ws')}/internal/agents/ws`, { headers: { authorization: `Bearer ${JOIN_TOKEN}` } });
    ws.once('upgrade', (res) => {
      resolve(String(res.headers[REPLICA_HEADER]));
      ws.terminate();
    });
    ws.once('error', reject);
  });
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** A gauge's value in Prometheus text (no labels), or null when absent. */
function gauge(text: string, name: string): number | null {
  const line = text.split('\n').find((l) => l.startsWith(`${name} `));
  return line === undefined ? null : Number(line.slice(name.length + 1));
}

describe.skipIf(!isRoot)('scheduler with two workers', () => {
  const children: Child[] = [];
  let stateDir: string;
  let sql: Sql;
  let databaseUrlForFailure: string;

  beforeAll(async () => {
    stateDir = mkdtempSync(join(tmpdir(), 'canto-workers-'));
    databaseUrlForFailure = await freshDatabaseUrl();
  });

  afterAll(async () => {
    for (const c of children.reverse()) await c.kill('SIGTERM');
    await sql?.end();
    await destroyLeftDesktops(join(stateDir, 'runtime'));
    rmSync(stateDir, { recursive: true, force: true });
  });

  it('serves through both workers, survives a worker crash, and stops whole', async () => {
    const databaseUrl = await freshDatabaseUrl();
    sql = connectDatabase(databaseUrl, { max: 1 });
    const scheduler = await startSchedulerProcess({
      databaseUrl,
      port: await freePort(),
      extra: { CANTO_WORKERS: '2', CANTO_REPLICA_ID: 'pool', CANTO_HOST_WAIT_MS: '10000' },
    });
    children.push(scheduler);
    const base = scheduler.url;
    const key = await mintKey(databaseUrl, 'workers');
    const call = (method: string, path: string, body?: unknown) => freshCall(base, key, method, path, body);

    // Two replicas, each with an agent listener of its own that is not the API port.
    const rows = await until(async () => {
      const r = await sql<Array<{ id: string; url: string }>>`SELECT id, url FROM replicas ORDER BY id`;
      return r.length === 2 ? r : null;
    }, 30_000, 'both workers to register');
    expect(rows.map((r) => r.id)).toEqual(REPLICAS);
    for (const row of rows) {
      expect(row.url).not.toBe(base);
      expect(await replicaAt(row.url)).toBe(row.id);
    }
    // The shared port reaches both workers, one new connection after another.
    const seen = new Set<string>();
    await until(async () => seen.add(await replicaAt(base)).size === 2, 10_000, 'connections to the API port to reach both workers');
    expect([...seen].sort()).toEqual(REPLICAS);

    // The agent is seeded with the shared port and links to every worker.
    const agent = startAgentProcess(base, stateDir);
    children.push(agent);
    await until(async () => gauge((await call('GET', '/metrics')).text, 'canto_agent_links') === 1, 30_000, 'the agent to link to both workers');
    const metrics = (await call('GET', '/metrics')).text;
    expect(gauge(metrics, 'canto_leader')).toBe(1);
    expect(metrics).toContain('canto_http_request_duration_seconds_count');

    const created = await call('POST', '/v1/desktops', { tier: 'small' });
    expect(created.status, created.text).toBe(201);
    const id: string = created.json.id;
    const woke = await call('POST', `/v1/desktops/${id}/wake?wait=true`);
    expect(woke.json?.state, woke.text).toBe('succeeded');
    // Consecutive connections alternate between the workers: each exec'd through its own link.
    for (let i = 0; i < 4; i++) {
      const exec = await call('POST', `/v1/desktops/${id}/exec`, { command: `echo run-${i}` });
      expect(exec.status, exec.text).toBe(200);
      expect(exec.json.stdout).toBe(`run-${i}\n`);
    }

    // kill -9 of one worker: the other keeps answering, and a new one takes the dead one's place.
    const primaryPid = scheduler.proc.pid!;
    const workersBefore = processTree(primaryPid).filter((p) => p !== primaryPid);
    expect(workersBefore).toHaveLength(2);
    // Each worker started with the malloc settings. glibc cuts its own copy of the variable at
    // the first ':' as it parses it, so /proc shows the first setting only.
    const [firstTunable] = Object.entries(MALLOC_TUNABLES).map(([name, value]) => `${name}=${value}`);
    for (const pid of workersBefore) {
      const environ = readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0');
      expect(environ).toContain(`GLIBC_TUNABLES=${firstTunable}`);
    }
    const victim = workersBefore[0]!;
    process.kill(victim, 'SIGKILL');
    await until(() => !alive(victim), 10_000, 'the worker to die');
    for (let i = 0; i < 4; i++) {
      const read = await call('GET', `/v1/desktops/${id}`);
      expect(read.status, read.text).toBe(200);
    }
    await until(() => {
      const now = processTree(primaryPid).filter((p) => p !== primaryPid);
      return now.length === 2 && !now.includes(victim);
    }, 30_000, 'the primary to start a new worker');
    await until(async () => {
      const r = await sql<Array<{ id: string }>>`SELECT id FROM replicas ORDER BY id`;
      return r.length === 2 && gauge((await call('GET', '/metrics')).text, 'canto_agent_links') === 1;
    }, 30_000, 'the new worker to register and the agent to link to it');
    for (let i = 0; i < 4; i++) {
      const exec = await call('POST', `/v1/desktops/${id}/exec`, { command: `echo again-${i}` });
      expect(exec.status, exec.text).toBe(200);
      expect(exec.json.stdout).toBe(`again-${i}\n`);
    }
    const destroyed = await call('POST', `/v1/desktops/${id}/destroy?wait=true`);
    expect(destroyed.json?.state, destroyed.text).toBe('succeeded');

    // SIGTERM of the primary stops the whole tree, each worker leaving the registry as it goes.
    const tree = processTree(primaryPid);
    expect(tree).toHaveLength(3);
    await scheduler.kill('SIGTERM');
    expect(scheduler.proc.exitCode, scheduler.output()).toBe(0);
    await until(() => tree.every((p) => !alive(p)), 10_000, 'every scheduler process to exit');
    expect((await sql`SELECT id FROM replicas`).length).toBe(0);
    // The logs name the worker each line came from.
    expect(scheduler.output()).toMatch(/"worker":2/);
  }, 180_000);

  it('fails the start when a worker cannot start', async () => {
    // Worker 1 listens for agents on the base port, worker 2 on the next. Below 32768, where the
    // kernel hands out no ports to outgoing connections, so that the next one stays free.
    const { held, heldPort } = await holdPortWithFreeNext();
    try {
      const result = await new Promise<{ code: number | null; output: string }>((resolve) => {
        const child = execFile(process.execPath, [join(import.meta.dirname, '..', '..', 'dist', 'cli.js'), 'scheduler'], {
          env: {
            PATH: process.env.PATH ?? '/usr/bin:/bin',
            DATABASE_URL: databaseUrlForFailure,
            CANTO_SECRET_KEY: generateSecretKey(),
            CANTO_LISTEN: '127.0.0.1:0',
            CANTO_WORKERS: '2',
            // Worker 1's agent port is taken.
            CANTO_AGENT_LISTEN: `127.0.0.1:${heldPort}`,
          },
          timeout: 60_000,
        }, (err, stdout, stderr) => resolve({ code: child.exitCode ?? (err as { code?: number } | null)?.code ?? null, output: stdout + stderr }));
      });
      expect(result.code, result.output).toBe(1);
      expect(result.output).toContain('worker 1 exited before it served');
      expect(result.output).toContain('EADDRINUSE');
    } finally {
      held.close();
    }
  });
});

/** A server holding a port below 32768 whose next port is free. */
async function holdPortWithFreeNext(): Promise<{ held: Server; heldPort: number }> {
  const listen = (port: number) =>
    new Promise<Server | null>((resolve) => {
      const server = createServer();
      server.once('error', () => resolve(null));
      server.listen(port, '127.0.0.1', () => resolve(server));
    });
  for (;;) {
    const port = 20_000 + Math.floor(Math.random() * 12_000);
    const held = await listen(port);
    if (held === null) continue;
    const next = await listen(port + 1);
    if (next !== null) {
      await new Promise<void>((resolve) => next.close(() => resolve()));
      return { held, heldPort: port };
    }
    held.close();
  }
}
