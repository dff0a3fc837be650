/**
 * `canto up --hosts 2` on the real runtime: two agents in the `up` process, each a host with its
 * own id, state directory and listeners. Desktops spread over both and run side by side; a drain
 * through the CLI moves one host's desktops, awake, to the other with their files and their
 * running programs; Ctrl-C stops everything. Needs root.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { HOST_ID_FILE } from '../../agent/src/host-identity.js';
import { crashTree, freePort } from '../helpers/processes.js';
import { api, until } from '../helpers/scheduler.js';
import { destroyLeftDesktops, memorySnapshotsHere } from '../helpers/sandbox.js';

const CLI = join(import.meta.dirname, '..', '..', 'dist', 'cli.js');
const run = promisify(execFile);
const isRoot = process.getuid?.() === 0;
const sha = (bytes: Uint8Array) => createHash('sha256').update(bytes).digest('hex');

describe.skipIf(!isRoot)('canto up --hosts 2', () => {
  const dataDir = mkdtempSync(join(tmpdir(), 'canto-up-hosts-'));
  const stateDirs = [join(dataDir, 'agent'), join(dataDir, 'agent-1')];
  let up: ChildProcess | null = null;

  afterAll(async () => {
    if (up && up.exitCode === null && up.signalCode === null) crashTree(up.pid!);
    for (const dir of stateDirs) await destroyLeftDesktops(join(dir, 'runtime'));
    rmSync(dataDir, { recursive: true, force: true });
  }, 120_000);

  it('runs two hosts that share nothing, spreads desktops over them, and drains one onto the other', async () => {
    const port = await freePort();
    const base = `http://127.0.0.1:${port}`;
    up = spawn(process.execPath, [CLI, 'up', '--hosts', '2', '--data-dir', dataDir, '--listen', `127.0.0.1:${port}`], {
      // Every listener of both agents on a port of its own (0 picks one).
      env: {
        PATH: process.env.PATH, HOME: '/root', CANTO_LOG_LEVEL: 'warn', CANTO_INGRESS_LISTEN: '127.0.0.1:0',
        CANTO_AGENT_STREAM_LISTEN: '127.0.0.1:0', CANTO_AGENT_INGRESS_LISTEN: '127.0.0.1:0',
        CANTO_AGENT_TRANSFER_LISTEN: '127.0.0.1:0', CANTO_AGENT_METRICS_LISTEN: '127.0.0.1:0',
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    up.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    up.stderr!.on('data', (d: Buffer) => (out += d.toString()));
    const exited = new Promise<number | null>((resolve) => up!.once('exit', (code) => resolve(code)));
    await until(() => {
      if (up!.exitCode !== null) throw new Error(`canto up exited: ${out}`);
      return out.includes('Press Ctrl-C');
    }, 120_000, 'canto up');
    const hostIds = stateDirs.map((dir) => readFileSync(join(dir, HOST_ID_FILE), 'utf8').trim());
    expect(new Set(hostIds).size).toBe(2);
    expect(out).toContain(`Hosts:    ${hostIds.join(', ')}`);
    const key = /API key:\s+(svc_sk_\S+)/.exec(out)![1]!;
    const call = api(base, key);
    const admin = async (args: string[]) => {
      try {
        const { stdout } = await run(process.execPath, [CLI, ...args, '--data-dir', dataDir], { timeout: 120_000 });
        return { code: 0, out: stdout };
      } catch (err) {
        const e = err as { code: number; stdout: string; stderr: string };
        return { code: e.code, out: e.stdout + e.stderr };
      }
    };
    const listed = JSON.parse((await admin(['hosts', 'list', '--json'])).out) as { hosts: Array<{ id: string; state: string }> };
    expect(listed.hosts.map((h) => [h.id, h.state]).sort()).toEqual(hostIds.map((id) => [id, 'ready']).sort());

    // Four desktops, awake, two on each host; a file and a running program in each.
    const ids: string[] = [];
    const files = new Map<string, string>();
    const programs = new Map<string, string>();
    for (let i = 0; i < 4; i++) {
      const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
      const woke = await call('POST', `/v1/desktops/${id}/wake?wait=true`);
      expect(woke.json.state, woke.text).toBe('succeeded');
      const body = randomBytes(1 << 20);
      const put = await fetch(`${base}/v1/desktops/${id}/files/root/data.bin`, { method: 'PUT', headers: { authorization: `Bearer ${key}` }, body });
      expect(put.status).toBe(204);
      files.set(id, sha(body));
      programs.set(id, (await call('POST', `/v1/desktops/${id}/exec`, { command: 'sleep 3600', detached: true })).json.process_id as string);
      ids.push(id);
    }
    const placed = await Promise.all(ids.map(async (id) => (await call('GET', `/v1/desktops/${id}`)).json.host_id as string));
    expect(hostIds.map((h) => placed.filter((p) => p === h).length)).toEqual([2, 2]);
    // Each desktop is under the state directory of its own host, and only there.
    for (const [i, id] of ids.entries()) {
      const dir = stateDirs[hostIds.indexOf(placed[i]!)]!;
      expect(existsSync(join(dir, 'runtime', 'desktops', id)), `${id} under ${dir}`).toBe(true);
      const other = stateDirs.find((d) => d !== dir)!;
      expect(existsSync(join(other, 'runtime', 'desktops', id)), `${id} not under ${other}`).toBe(false);
    }

    const drained = await admin(['hosts', 'drain', hostIds[0]!, '--wait']);
    expect(drained.code, drained.out).toBe(0);
    expect(drained.out).toMatch(/drained in [\d.]+ m?s: 2 desktops moved/);
    for (const id of ids) {
      const d = (await call('GET', `/v1/desktops/${id}`)).json;
      expect(d.host_id, id).toBe(hostIds[1]);
      expect(d.state, id).toBe('awake');
      const read = await fetch(`${base}/v1/desktops/${id}/files/root/data.bin`, { headers: { authorization: `Bearer ${key}` } });
      expect(sha(new Uint8Array(await read.arrayBuffer())), id).toBe(files.get(id));
      if (!(await memorySnapshotsHere())) continue; // Moved cold: programs restart.
      expect((await call('GET', `/v1/desktops/${id}/processes/${programs.get(id)}`)).json.status, id).toBe('running');
    }

    up.kill('SIGINT');
    expect(await exited).toBe(0);
  }, 300_000);
});
