/**
 * The `canto` CLI as users run it (the built bundle): `canto up` with its embedded PostgreSQL
 * prints the API URL and a bootstrap key on the first start only, serves the API, refuses a second
 * `canto up` on its data directory, and on Ctrl-C hibernates awake desktops before it stops;
 * `canto keys create` prints only a key; `canto hosts list` shows the host; `canto status` the
 * replica leading and the host; `canto agent` refuses a join token on its command line.
 * The agent here uses the fake runtime so this test stays fast; the real runtime is covered by
 * the lifecycle e2e test.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { spawn, execFile, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { crashTree, freePort } from '../helpers/processes.js';
import { until } from '../helpers/scheduler.js';

const CLI = join(import.meta.dirname, '..', '..', 'dist', 'cli.js');
const run = promisify(execFile);
const isRoot = process.getuid?.() === 0;

/** Every listener on a port of its own, so `canto up`s of other test files never collide. */
const LOCAL_PORTS = {
  CANTO_INGRESS_LISTEN: '127.0.0.1:0',
  CANTO_AGENT_STREAM_LISTEN: '127.0.0.1:0',
  CANTO_AGENT_INGRESS_LISTEN: '127.0.0.1:0',
  CANTO_AGENT_TRANSFER_LISTEN: '127.0.0.1:0',
  CANTO_AGENT_METRICS_LISTEN: '127.0.0.1:0',
};

/** Every `canto up` started here, so a failed test leaves none running. */
const started: ChildProcess[] = [];

async function startUp(dataDir: string, port: number, extraEnv: Record<string, string> = {}) {
  const proc = spawn(process.execPath, [CLI, 'up', '--data-dir', dataDir, '--listen', `127.0.0.1:${port}`], {
    // One storage slot: the awake desktop takes it, and any later one waits for a host for ever.
    env: { PATH: process.env.PATH, HOME: '/root', CANTO_AGENT_RUNTIME: 'fake', CANTO_LOG_LEVEL: 'warn', CANTO_HOST_SLOTS: '1', ...LOCAL_PORTS, ...extraEnv },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  started.push(proc);
  let out = '';
  let err = '';
  proc.stdout.on('data', (d: Buffer) => (out += d.toString()));
  proc.stderr.on('data', (d: Buffer) => (err = (err + d.toString()).slice(-16_384)));
  const exited = new Promise<number | null>((resolve) => proc.once('exit', (code) => resolve(code)));
  await until(() => {
    if (proc.exitCode !== null) throw new Error(`canto up exited: ${out}`);
    return out.includes('Press Ctrl-C');
  }, 60_000, 'canto up');
  return {
    out: () => out,
    /** Ctrl-C, then its exit code; a stop that hangs fails with what it printed. */
    async stop(timeoutMs = 60_000) {
      proc.kill('SIGINT');
      let timer: NodeJS.Timeout | undefined;
      const late = new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`canto up still running ${timeoutMs} ms after Ctrl-C:\n${out}\n${err}`)), timeoutMs);
      });
      try {
        return await Promise.race([exited, late]);
      } finally {
        clearTimeout(timer);
      }
    },
  };
}

describe.skipIf(!isRoot)('canto CLI', () => {
  const dataDir = mkdtempSync(join(tmpdir(), 'canto-up-'));
  afterAll(() => {
    for (const proc of started) if (proc.exitCode === null && proc.signalCode === null) crashTree(proc.pid!);
    rmSync(dataDir, { recursive: true, force: true });
  });

  it('runs everything with `canto up`, prints a key once, and stops cleanly', async () => {
    const port = await freePort();
    const ingressPort = await freePort();
    const first = await startUp(dataDir, port, { CANTO_INGRESS_LISTEN: `127.0.0.1:${ingressPort}` });
    const url = `http://127.0.0.1:${port}`;
    expect(first.out()).toContain(`${url}/v1`);
    // Exposed ports are served where the ingress listens, and their URLs say so.
    expect(first.out()).toContain(`Ingress:  http://127.0.0.1:${ingressPort} (exposed ports: http://{port}-{desktop_id}.localhost:${ingressPort})`);
    const key = /API key:\s+(svc_sk_\S+)/.exec(first.out())?.[1];
    expect(key).toBeTruthy();
    expect(first.out()).toContain(`Admin:    ${url}/admin/v1 (token: ${join(dataDir, 'secrets.json')}; try canto hosts list --data-dir ${dataDir})`);
    expect(statSync(join(dataDir, 'secrets.json')).mode & 0o777).toBe(0o600);

    // The web console, served from the build's copy of console/.
    expect(first.out()).toContain(`Console:  ${url}/console/`);
    const page = await fetch(`${url}/console/`);
    expect(page.status).toBe(200);
    expect(page.headers.get('content-security-policy')).toContain("script-src 'self'");
    expect(await page.text()).toContain('js/main.js');
    expect((await fetch(`${url}/console/js/main.js`)).headers.get('content-type')).toBe('text/javascript; charset=utf-8');
    // The browser libraries, found from the build in node_modules as from the source tree.
    for (const lib of ['vendor/novnc/core/rfb.js', 'vendor/xterm/lib/xterm.mjs', 'vendor/xterm-addon-fit/lib/addon-fit.mjs']) {
      const res = await fetch(`${url}/console/${lib}`);
      expect(res.status, lib).toBe(200);
      expect(res.headers.get('content-type'), lib).toBe('text/javascript; charset=utf-8');
    }

    const auth = { authorization: `Bearer ${key}`, 'content-type': 'application/json' };
    const created = await fetch(`${url}/v1/desktops`, { method: 'POST', headers: auth, body: '{"tier":"small"}' });
    expect(created.status).toBe(201);
    const { id } = (await created.json()) as { id: string };
    const woke = await fetch(`${url}/v1/desktops/${id}/wake?wait=true`, { method: 'POST', headers: auth });
    expect(woke.status).toBe(200);
    const exposed = await fetch(`${url}/v1/desktops/${id}/ports`, { method: 'POST', headers: auth, body: '{"port":8000,"public":true}' });
    expect(exposed.status).toBe(201);
    expect(((await exposed.json()) as { url: string }).url).toBe(`http://8000-${id}.localhost:${ingressPort}`);

    // A second key, from another process, while `canto up` runs: stdout is the key alone.
    const { stdout } = await run(process.execPath, [CLI, 'keys', 'create', '--org', 'acme', '--data-dir', dataDir]);
    expect(stdout).toMatch(/^svc_sk_[A-Za-z0-9_-]{43}\n$/);
    const other = await fetch(`${url}/v1/desktops/${id}`, { headers: { authorization: `Bearer ${stdout.trim()}` } });
    expect(other.status).toBe(404);

    const hosts = await run(process.execPath, [CLI, 'hosts', 'list', '--data-dir', dataDir]);
    expect(hosts.stdout).toMatch(/^ID\s+HOSTNAME\s+STATUS/);
    expect(hosts.stdout).toMatch(/host_[0-9a-v]{24}\s+\S+\s+ready\s+fake/);

    const status = JSON.parse((await run(process.execPath, [CLI, 'status', '--json', '--data-dir', dataDir])).stdout);
    expect(status.replicas).toEqual([expect.objectContaining({ role: 'leader', url: `http://127.0.0.1:${port}` })]);
    expect(status.lease).toMatchObject({ live: true, epoch: expect.any(Number) });
    expect(status.hosts).toEqual([expect.objectContaining({ status: 'ready', desktops: { awake: 1 } })]);
    expect(status.warnings).toEqual([]);
    const table = (await run(process.execPath, [CLI, 'status', '--data-dir', dataDir])).stdout;
    expect(table).toMatch(/^Replicas\n\s+ID\s+URL\s+ROLE/);
    expect(table).toContain('leader');

    // One `canto up` per data directory.
    const twice = await run(process.execPath, [CLI, 'up', '--data-dir', dataDir, '--listen', '127.0.0.1:0'], { env: { ...process.env, ...LOCAL_PORTS } }).catch((err: { code: number; stderr: string }) => err);
    expect(twice).toMatchObject({ code: 1, stderr: expect.stringContaining('canto up is already running') });

    // Ctrl-C with a ?wait=true open on an operation that cannot proceed (no host has room):
    // the awake desktop is hibernated first, the wait is answered, and canto up is gone promptly.
    const stuck = ((await (await fetch(`${url}/v1/desktops`, { method: 'POST', headers: auth, body: '{"tier":"small"}' })).json()) as { id: string }).id;
    const waiting = fetch(`${url}/v1/desktops/${stuck}/wake?wait=true`, { method: 'POST', headers: auth });
    await until(async () => ((await (await fetch(`${url}/v1/desktops/${stuck}`, { headers: auth })).json()) as { state: string }).state === 'waking', 5_000, 'the wake to be recorded');
    const stopAt = Date.now();
    expect(await first.stop()).toBe(0);
    expect(Date.now() - stopAt).toBeLessThan(10_000);
    const answered = await waiting;
    expect(answered.status).toBe(200);
    expect(['pending', 'running']).toContain(((await answered.json()) as { state: string }).state);
    expect(first.out()).toMatch(/hibernated 1 of 1 desktop/);
    expect(first.out()).toContain('Canto stopped.');

    // Second start on the same data dir: same data, no new bootstrap key.
    const second = await startUp(dataDir, port);
    expect(second.out()).not.toContain('API key:');
    const again = await fetch(`${url}/v1/desktops/${id}`, { headers: auth });
    expect(((await again.json()) as { state: string }).state).toBe('hibernated');
    expect(await second.stop()).toBe(0);
    expect(second.out()).not.toMatch(/hibernated \d+ of/);
    // Two starts and stops of a whole `canto up`, its PostgreSQL syncing to disk, on a loaded host.
  }, 180_000);

  it('hibernates on Ctrl-C only the desktops of its own agents, not those of an agent joined from outside', async () => {
    const ownDir = mkdtempSync(join(tmpdir(), 'canto-up-'));
    const port = await freePort();
    const url = `http://127.0.0.1:${port}`;
    let outside: ChildProcess | undefined;
    try {
      const first = await startUp(ownDir, port);
      const auth = { authorization: `Bearer ${/API key:\s+(svc_sk_\S+)/.exec(first.out())![1]}`, 'content-type': 'application/json' };
      const awakeDesktop = async () => {
        const { id } = (await (await fetch(`${url}/v1/desktops`, { method: 'POST', headers: auth, body: '{"tier":"small"}' })).json()) as { id: string };
        expect((await fetch(`${url}/v1/desktops/${id}/wake?wait=true`, { method: 'POST', headers: auth })).status).toBe(200);
        return ((await (await fetch(`${url}/v1/desktops/${id}`, { headers: auth })).json()) as { id: string; host_id: string });
      };
      const own = await awakeDesktop();
      // A host of its own: `up`'s host has its one slot taken, so the next desktop goes there.
      const tokenFile = join(ownDir, 'join-token');
      writeFileSync(tokenFile, (JSON.parse(readFileSync(join(ownDir, 'secrets.json'), 'utf8')) as { join_token: string }).join_token, { mode: 0o600 });
      outside = spawn(process.execPath, [CLI, 'agent', '--runtime', 'fake', '--scheduler', url, '--token-file', tokenFile, '--state-dir', join(ownDir, 'outside')], {
        env: { PATH: process.env.PATH, HOME: '/root', CANTO_LOG_LEVEL: 'warn', ...LOCAL_PORTS },
        stdio: 'ignore',
      });
      started.push(outside);
      const hosts = async () => JSON.parse((await run(process.execPath, [CLI, 'hosts', 'list', '--json', '--data-dir', ownDir])).stdout).hosts as Array<{ id: string; state: string }>;
      await until(async () => (await hosts()).filter((h) => h.state === 'ready').length === 2, 20_000, 'the outside agent to join');
      const theirs = await awakeDesktop();
      expect(theirs.host_id).not.toBe(own.host_id);

      const stopAt = Date.now();
      expect(await first.stop()).toBe(0);
      // Its hibernate would wait on a host `up` does not stop (or, were it stopping too, one that is gone).
      expect(first.out()).toMatch(/hibernated 1 of 1 desktop/);
      expect(Date.now() - stopAt).toBeLessThan(10_000);

      const second = await startUp(ownDir, port);
      const state = async (id: string) => ((await (await fetch(`${url}/v1/desktops/${id}`, { headers: auth })).json()) as { state: string }).state;
      expect(await state(own.id)).toBe('hibernated');
      expect(await state(theirs.id)).toBe('awake');
      expect(await second.stop()).toBe(0);
    } finally {
      if (outside?.exitCode === null) crashTree(outside.pid!);
      rmSync(ownDir, { recursive: true, force: true });
    }
  }, 180_000);

  it('canto status makes no database: a data directory without one is refused (migrations.test.ts: nor does it migrate one)', async () => {
    const empty = mkdtempSync(join(tmpdir(), 'canto-status-'));
    try {
      const none = await run(process.execPath, [CLI, 'status', '--data-dir', empty]).catch((err: { code: number; stderr: string }) => err);
      expect(none).toMatchObject({ code: 1, stderr: expect.stringContaining(`${empty} holds no database of canto up`) });
      expect(readdirSync(empty)).toEqual([]);
    } finally {
      rmSync(empty, { recursive: true, force: true });
    }
  });

  it('refuses a join token on the command line, and names a token file it cannot read', async () => {
    const onCommandLine = await run(process.execPath, [CLI, 'agent', '--scheduler', 'http://127.0.0.1:9', '--token', 'visible-in-ps']).catch((err: { code: number; stderr: string }) => err);
    expect(onCommandLine).toMatchObject({ code: 1, stderr: expect.stringContaining('--token-file') });
    const missing = await run(process.execPath, [CLI, 'agent', '--scheduler', 'http://127.0.0.1:9', '--token-file', join(dataDir, 'nope')]).catch((err: { code: number; stderr: string }) => err);
    expect(missing).toMatchObject({ code: 1, stderr: expect.stringContaining(`cannot read the join token file ${join(dataDir, 'nope')}`) });
  });
});
