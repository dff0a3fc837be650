/**
 * The `canto` CLI as users run it (the built bundle): `canto up` with its embedded PostgreSQL
 * prints the API URL and a bootstrap key on the first start only, serves the API, and stops
 * cleanly on Ctrl-C; `canto keys create` prints only a key; `canto hosts list` shows the host.
 * The agent here uses the fake runtime so this test stays fast; the real runtime is covered by
 * the lifecycle e2e test.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { spawn, execFile } from 'node:child_process';
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { freePort } from '../helpers/processes.js';
import { until } from '../helpers/scheduler.js';

const CLI = join(import.meta.dirname, '..', '..', 'dist', 'cli.js');
const run = promisify(execFile);
const isRoot = process.getuid?.() === 0;

async function startUp(dataDir: string, port: number) {
  const proc = spawn(process.execPath, [CLI, 'up', '--data-dir', dataDir, '--listen', `127.0.0.1:${port}`], {
    env: { PATH: process.env.PATH, HOME: '/root', CANTO_AGENT_RUNTIME: 'fake', CANTO_LOG_LEVEL: 'warn' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  proc.stdout.on('data', (d: Buffer) => (out += d.toString()));
  proc.stderr.on('data', () => {});
  const exited = new Promise<number | null>((resolve) => proc.once('exit', (code) => resolve(code)));
  await until(() => {
    if (proc.exitCode !== null) throw new Error(`canto up exited: ${out}`);
    return out.includes('Press Ctrl-C');
  }, 60_000, 'canto up');
  return {
    out: () => out,
    async stop() {
      proc.kill('SIGINT');
      return exited;
    },
  };
}

describe.skipIf(!isRoot)('canto CLI', () => {
  const dataDir = mkdtempSync(join(tmpdir(), 'canto-up-'));
  afterAll(() => rmSync(dataDir, { recursive: true, force: true }));

  it('runs everything with `canto up`, prints a key once, and stops cleanly', async () => {
    const port = await freePort();
    const first = await startUp(dataDir, port);
    const url = `http://127.0.0.1:${port}`;
    expect(first.out()).toContain(`${url}/v1`);
    const key = /API key:\s+(svc_sk_\S+)/.exec(first.out())?.[1];
    expect(key).toBeTruthy();
    expect(statSync(join(dataDir, 'secrets.json')).mode & 0o777).toBe(0o600);

    const auth = { authorization: `Bearer ${key}`, 'content-type': 'application/json' };
    const created = await fetch(`${url}/v1/desktops`, { method: 'POST', headers: auth, body: '{"tier":"small"}' });
    expect(created.status).toBe(201);
    const { id } = (await created.json()) as { id: string };
    const woke = await fetch(`${url}/v1/desktops/${id}/wake?wait=true`, { method: 'POST', headers: auth });
    expect(woke.status).toBe(200);

    // A second key, from another process, while `canto up` runs: stdout is the key alone.
    const { stdout } = await run(process.execPath, [CLI, 'keys', 'create', '--org', 'acme', '--data-dir', dataDir]);
    expect(stdout).toMatch(/^svc_sk_[A-Za-z0-9_-]{43}\n$/);
    const other = await fetch(`${url}/v1/desktops/${id}`, { headers: { authorization: `Bearer ${stdout.trim()}` } });
    expect(other.status).toBe(404);

    const hosts = await run(process.execPath, [CLI, 'hosts', 'list', '--data-dir', dataDir]);
    expect(hosts.stdout).toMatch(/^ID\s+HOSTNAME\s+STATUS/);
    expect(hosts.stdout).toMatch(/host_[0-9a-v]{24}\s+\S+\s+ready\s+fake/);

    expect(await first.stop()).toBe(0);

    // Second start on the same data dir: same data, no new bootstrap key.
    const second = await startUp(dataDir, port);
    expect(second.out()).not.toContain('API key:');
    const again = await fetch(`${url}/v1/desktops/${id}`, { headers: auth });
    expect(((await again.json()) as { state: string }).state).toBe('awake');
    expect(await second.stop()).toBe(0);
  });
});
