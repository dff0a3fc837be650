/**
 * Draining a host, end to end on one machine with the real runtime: `canto up` (its own agent,
 * host A) plus two `canto agent` processes (hosts B and C), each with its own state directory and
 * listeners. Twelve desktops spread 4/4/4; each gets a file of random bytes and a detached
 * process. B is drained with `canto hosts drain --wait` while C, a target, is killed with SIGKILL
 * mid-drain and started again: the drain resumes and finishes, every desktop is on A or C in the
 * state it had, every file is identical by sha256, and (on a host whose CRIU makes memory
 * snapshots) every process still runs. B's agent is then stopped and `canto hosts remove` works.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { spawn, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { HOST_ID_FILE } from '../../agent/src/host-identity.js';
import { crashTree, freePort, startAgentProcess, type Child } from '../helpers/processes.js';
import { api, JOIN_TOKEN, until } from '../helpers/scheduler.js';
import { destroyLeftDesktops, memorySnapshotsHere } from '../helpers/sandbox.js';

const CLI = join(import.meta.dirname, '..', '..', 'dist', 'cli.js');
const isRoot = process.getuid?.() === 0;
const sha = (b: Uint8Array) => createHash('sha256').update(b).digest('hex');

/** Runs the CLI to completion; answers its exit code and output. */
function cli(args: string[]): Promise<{ code: number | null; out: string }> {
  return new Promise((resolve) => {
    const proc = spawn(process.execPath, [CLI, ...args], { env: { PATH: process.env.PATH, HOME: '/root' }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    proc.stdout.on('data', (d: Buffer) => (out += d.toString()));
    proc.stderr.on('data', (d: Buffer) => (out += d.toString()));
    proc.once('exit', (code) => resolve({ code, out }));
  });
}

describe.skipIf(!isRoot)('draining a host of three on one machine', () => {
  const dataDir = mkdtempSync(join(tmpdir(), 'canto-drain-'));
  const stateB = join(dataDir, 'host-b');
  const stateC = join(dataDir, 'host-c');
  let up: ChildProcess | null = null;
  let upOutput = () => '';
  const agents: Child[] = [];

  afterAll(async () => {
    if (process.env.CANTO_TEST_DUMP) {
      const { writeFileSync } = await import('node:fs');
      writeFileSync(`${process.env.CANTO_TEST_DUMP}-up.log`, upOutput());
      agents.forEach((a, i) => writeFileSync(`${process.env.CANTO_TEST_DUMP}-agent${i}.log`, a.output()));
    }
    for (const a of agents) await a.kill('SIGKILL');
    if (up && up.exitCode === null) crashTree(up.pid!);
    for (const dir of [join(dataDir, 'agent', 'runtime'), join(stateB, 'runtime'), join(stateC, 'runtime')]) await destroyLeftDesktops(dir);
    rmSync(dataDir, { recursive: true, force: true });
  }, 120_000);

  it('moves every desktop off B, through a kill -9 of a target, and loses nothing', async () => {
    const port = await freePort();
    const base = `http://127.0.0.1:${port}`;
    up = spawn(process.execPath, [CLI, 'up', '--data-dir', dataDir, '--listen', `127.0.0.1:${port}`], {
      env: {
        PATH: process.env.PATH, HOME: '/root', CANTO_LOG_LEVEL: process.env.CANTO_TEST_DUMP ? 'info' : 'warn', CANTO_JOIN_TOKEN: JOIN_TOKEN,
        CANTO_INGRESS_LISTEN: '127.0.0.1:0', CANTO_AGENT_STREAM_LISTEN: '127.0.0.1:0', CANTO_AGENT_INGRESS_LISTEN: '127.0.0.1:0',
        CANTO_AGENT_TRANSFER_LISTEN: '127.0.0.1:0', CANTO_AGENT_METRICS_LISTEN: '127.0.0.1:0',
        // Spread and drain are measured, not failure detection: on a machine the whole suite
        // shares, a link read silent for a moment would send a placement elsewhere.
        CANTO_HOST_DOWN_MS: '15000',
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    up.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    up.stderr!.on('data', (d: Buffer) => (out += d.toString()));
    upOutput = () => out;
    await until(() => {
      if (up!.exitCode !== null) throw new Error(`canto up exited:\n${out}`);
      return out.includes('Press Ctrl-C');
    }, 90_000, 'canto up');
    const key = /API key:\s+(svc_sk_\S+)/.exec(out)![1]!;
    const call = api(base, key);
    const admin = (args: string[]) => cli([...args, '--api', base, '--data-dir', dataDir]);
    const hostA = /Host:\s+(host_\S+)/.exec(out)![1]!;

    agents.push(startAgentProcess(base, stateB), startAgentProcess(base, stateC));
    const hosts = await until(async () => {
      const listed = await admin(['hosts', 'list', '--json']);
      const all = listed.code === 0 ? (JSON.parse(listed.out).hosts as Array<{ id: string; state: string }>) : [];
      return all.length === 3 && all.every((h) => h.state === 'ready') ? all.map((h) => h.id) : null;
    }, 30_000, 'three ready hosts');
    const [hostB, hostC] = await Promise.all([hostIdOf(stateB), hostIdOf(stateC)]);
    expect(new Set(hosts)).toEqual(new Set([hostA, hostB, hostC]));

    // Twelve desktops, spread evenly; a file and a detached process on each.
    const ids: string[] = [];
    for (let i = 0; i < 12; i++) ids.push((await call('POST', '/v1/desktops', { tier: 'small' })).json.id);
    // Placed (a disk on a host) before any boots: placement alone decides the spread.
    const placed = await until(async () => {
      const rows = await Promise.all(ids.map(async (id) => (await call('GET', `/v1/desktops/${id}`)).json));
      return rows.every((d) => d.host_id) ? rows : null;
    }, 30_000, 'twelve desktops placed');
    const perHost = new Map<string, string[]>();
    for (const d of placed) perHost.set(d.host_id, [...(perHost.get(d.host_id) ?? []), d.id]);
    const counts = [...perHost.values()].map((v) => v.length);
    expect(counts, JSON.stringify(counts)).toEqual([4, 4, 4]);
    for (const id of ids) {
      const woke = await call('POST', `/v1/desktops/${id}/wake?wait=true`);
      expect(woke.json.state, woke.text).toBe('succeeded');
    }
    const files = new Map<string, string>();
    const processes = new Map<string, string>();
    for (const id of ids) {
      const body = randomBytes(2 * 1024 * 1024);
      const put = await fetch(`${base}/v1/desktops/${id}/files/root/data.bin`, { method: 'PUT', headers: { authorization: `Bearer ${key}` }, body });
      expect(put.status, `${id}: ${await put.clone().text()}`).toBe(204);
      files.set(id, sha(body));
      const spawned = await call('POST', `/v1/desktops/${id}/exec`, { command: 'sleep 3600', detached: true });
      expect(spawned.status, spawned.text).toBe(202);
      processes.set(id, spawned.json.process_id);
    }
    // One of B's desktops hibernated: it must come back hibernated.
    const onB = perHost.get(hostB)!;
    const hibernated = await call('POST', `/v1/desktops/${onB[0]}/hibernate?wait=true`);
    expect(hibernated.json.state, hibernated.text).toBe('succeeded');
    const states = new Map<string, string>();
    for (const id of ids) states.set(id, (await call('GET', `/v1/desktops/${id}`)).json.state);

    // Drain B; kill -9 C (a target) while it runs, then bring C back with the same state.
    const draining = admin(['hosts', 'drain', hostB, '--wait', '--parallel', '2']);
    // Killed mid-transfer: once a move to C is copying (its pre-copy, or the copy after the stop).
    const adminToken = (JSON.parse(readFileSync(join(dataDir, 'secrets.json'), 'utf8')) as { admin_token: string }).admin_token;
    const adminGet = async (path: string) => (await fetch(base + path, { headers: { authorization: `Bearer ${adminToken}` } })).json();
    await until(async () => {
      const { desktops } = (await adminGet(`/admin/v1/desktops?host_id=${hostB}`)) as { desktops: Array<{ operation: { id: string; kind: string; phase: string | null } | null }> };
      for (const d of desktops) {
        if (d.operation?.kind !== 'move' || !['planned', 'precopied', 'stopped'].includes(d.operation.phase ?? '')) continue;
        if (((await adminGet(`/admin/v1/operations/${d.operation.id}`)) as { target_host_id: string | null }).target_host_id === hostC) return true;
      }
      return false;
    }, 30_000, 'a move to C copying');
    const c = agents[1]!;
    await c.kill('SIGKILL');
    await new Promise((r) => setTimeout(r, 1500));
    agents[1] = startAgentProcess(base, stateC);
    const drained = await draining;
    expect(drained.code, drained.out).toBe(0);
    expect(drained.out).toMatch(new RegExp(`drained in \\d+\\.\\d s: ${perHost.get(hostB)!.length} desktops moved`));

    for (const id of ids) {
      const d = (await call('GET', `/v1/desktops/${id}`)).json;
      expect(d.host_id, id).not.toBe(hostB);
      expect(d.state, id).toBe(states.get(id));
      if (d.state !== 'awake') {
        const woke = await call('POST', `/v1/desktops/${id}/wake?wait=true`);
        expect(woke.json.state, `${id}: ${woke.text}`).toBe('succeeded');
      }
      // As a client should, a 503 (a host link dropped for a moment under this machine's load) is retried.
      const read = await retry503(() => fetch(`${base}/v1/desktops/${id}/files/root/data.bin`, { headers: { authorization: `Bearer ${key}` } }));
      expect(read.status, `${id}: ${await read.clone().text()}`).toBe(200);
      expect(sha(new Uint8Array(await read.arrayBuffer())), id).toBe(files.get(id));
      if (onB.includes(id) && !(await memorySnapshotsHere())) continue; // Moved cold: its programs restarted.
      if (id === onB[0]) continue; // Hibernated before the drain: a cold stop here.
      let status = await call('GET', `/v1/desktops/${id}/processes/${processes.get(id)}`);
      for (let i = 0; i < 30 && status.status === 503; i++) {
        await new Promise((r) => setTimeout(r, 1000));
        status = await call('GET', `/v1/desktops/${id}/processes/${processes.get(id)}`);
      }
      expect(status.json.status, `${id}: ${status.text}`).toBe('running');
    }

    // B is empty: stop its agent and remove it.
    expect((await admin(['hosts', 'remove', hostB])).code).not.toBe(0);
    await agents[0]!.kill('SIGTERM');
    await until(async () => JSON.parse((await admin(['hosts', 'show', hostB, '--json'])).out).state === 'down', 40_000, 'B to read down (CANTO_HOST_DOWN_MS after its agent stopped)');
    const removed = await admin(['hosts', 'remove', hostB]);
    expect(removed.code, removed.out).toBe(0);
  }, 600_000);
});

/** `request` again while it answers 503, after its Retry-After, for up to 30 s. */
async function retry503(request: () => Promise<Response>): Promise<Response> {
  for (let i = 0; ; i++) {
    const res = await request();
    if (res.status !== 503 || i >= 30) return res;
    await res.arrayBuffer();
    await new Promise((r) => setTimeout(r, Number(res.headers.get('retry-after') ?? 1) * 1000));
  }
}

/** The host id an agent state directory holds once its agent has started (agent/src/host-identity.ts). */
async function hostIdOf(stateDir: string): Promise<string> {
  const { readFile } = await import('node:fs/promises');
  return until(async () => (await readFile(join(stateDir, HOST_ID_FILE), 'utf8').catch(() => '')).trim() || null, 15_000, `the host id in ${stateDir}`);
}
