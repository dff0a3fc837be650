/**
 * Moves and drains through the whole service: a `canto scheduler` process and two `canto agent`
 * processes on the sandbox runtime, each with a state directory of its own.
 *
 * - move downtime: an awake desktop holding 100 MiB of written files is moved while a client
 *   reads a small file from it as fast as it can; downtime is from the last read answered before
 *   the move to the first answered after it. Baseline: the same measure across a hibernate and a
 *   wake on one host (what a user sees of a restart there).
 * - drain rate: four hibernated desktops of 24 MiB each are drained off their host; bytes moved
 *   over the drain's wall time, from its request to its end as the scheduler recorded them.
 *   Baseline: `cp -a` of the same desktop directories on this disk.
 * - destroy: an awake desktop holding 100 MiB and 20,000 small files, destroyed as a client waits
 *   for it (measured last). Baseline: `rm -rf` of as many files and bytes on this disk, which a
 *   destroy does not wait for (its files are removed behind its answer).
 *
 * On a host without memory snapshots both moves and the baseline are cold (disk kept, programs
 * restarted); where CRIU works, both keep memory.
 */
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connectDatabase } from '../../scheduler/src/store/db.js';
import { createApiKey } from '../../scheduler/src/services/keys.js';
import { generateSecretKey } from '../../scheduler/src/crypto/secret-box.js';
import { freePort, startAgentProcess, startSchedulerProcess, type Child } from '../helpers/processes.js';
import { median, table, timed } from './stats.js';
import { until } from '../helpers/wait.js';

export interface DrainBenchOptions {
  /** A PostgreSQL server URL; the bench makes a database of its own on it. */
  databaseUrl: string;
  stateDir: string;
  runs: number;
}

const ADMIN_TOKEN = `bench-admin-${randomBytes(16).toString('hex')}`;
const MIB = 1024 * 1024;
/** How often the drain is read while it runs, as the CLI's `--wait` reads it. */
const DRAIN_POLL_MS = 250;
/** Empty files the destroyed desktops hold, as a home directory with a dev setup has. */
const SMALL_FILES = 20_000;


export async function benchDrain(options: DrainBenchOptions): Promise<void> {
  const runs = Math.max(3, Math.min(options.runs, 5));
  const admin = connectDatabase(options.databaseUrl, { max: 1 });
  const name = `drain_${Date.now()}`;
  await admin.unsafe(`CREATE DATABASE ${name}`);
  await admin.end();
  const databaseUrl = options.databaseUrl.replace(/\/[^/?]+\?/, `/${name}?`);
  const children: Child[] = [];
  try {
    const scheduler = await startSchedulerProcess({
      databaseUrl, port: await freePort(), secretKey: generateSecretKey(), extra: { CANTO_LOG_LEVEL: 'warn', CANTO_ADMIN_TOKEN: ADMIN_TOKEN },
    });
    children.push(scheduler);
    for (const host of ['a', 'b']) children.push(startAgentProcess(scheduler.url, join(options.stateDir, host), { CANTO_LOG_LEVEL: 'warn' }));
    const sql = connectDatabase(databaseUrl, { max: 1 });
    const key = (await createApiKey(sql, 'bench')).key;
    await sql.end();
    const client = new Client(scheduler.url, key);
    const hosts = await until(async () => {
      const listed = (await client.admin('GET', '/admin/v1/hosts')) as { hosts: Array<{ id: string; state: string }> };
      return listed.hosts.length === 2 && listed.hosts.every((h) => h.state === 'ready') ? listed.hosts.map((h) => h.id) : null;
    }, 30_000, 'two ready hosts');

    const moveDowntime: number[] = [];
    const restartDowntime: number[] = [];
    const phases: Array<Record<string, number>> = [];
    const bytes: Array<Record<string, number>> = [];
    const destroyMs: number[] = [];
    const removeMs: number[] = [];
    for (let i = 0; i < runs; i++) {
      const id = await client.awakeDesktop();
      // 100 MiB in files of 8 MiB, the API's largest single write.
      for (let f = 0; f < 12; f++) await client.put(id, `root/data-${f}.bin`, randomBytes(f === 11 ? 12 * MIB - 8 * MIB : 8 * MIB));
      await client.put(id, 'root/probe', Buffer.from('probe'));
      restartDowntime.push(await readGap(client, id, async () => {
        await client.api('POST', `/v1/desktops/${id}/hibernate?wait=true`);
        await client.api('POST', `/v1/desktops/${id}/wake?wait=true`);
      }));
      moveDowntime.push(await readGap(client, id, async () => {
        const op = (await client.admin('POST', `/admin/v1/desktops/${id}/move`, {})) as { id: string };
        const result = await client.settled(op.id);
        phases.push(result.phase_ms ?? {});
        bytes.push({ total: result.total_bytes ?? 0, 'fetched after the stop': result.fetched_bytes ?? 0, 'pre-copied': result.precopied_bytes ?? 0 });
      }));
      await client.api('POST', `/v1/desktops/${id}/destroy?wait=true`);
    }

    // Drain: four hibernated desktops on one host, 24 MiB each.
    const drained = hosts[0]!;
    await client.admin('POST', `/admin/v1/hosts/${hosts[1]}/cordon`);
    const ids: string[] = [];
    for (let i = 0; i < 4; i++) {
      const id = await client.awakeDesktop();
      for (let f = 0; f < 3; f++) await client.put(id, `root/data-${f}.bin`, randomBytes(8 * MIB));
      await client.api('POST', `/v1/desktops/${id}/hibernate?wait=true`);
      ids.push(id);
    }
    await client.admin('POST', `/admin/v1/hosts/${hosts[1]}/uncordon`);
    const copyMs = localCopyMs(join(options.stateDir, hosts[0] === drained ? 'a' : 'b'));
    await client.admin('POST', `/admin/v1/hosts/${drained}/drain`, { parallel: 2 });
    // Watched as `canto hosts drain --wait` does, a few times a second: reading the host every
    // few milliseconds cost the scheduler and this process a fifth of the machine's CPU and the
    // drain as much of its rate. Its time is the server's own, from the request to the end.
    const host = await until(async () => {
      const h = (await client.admin('GET', `/admin/v1/hosts/${drained}`)) as {
        drain: { state: string; moved_bytes: number; error: string | null; requested_at: string; finished_at: string | null };
      };
      if (h.drain.state === 'stopped') throw new Error(`drain stopped: ${h.drain.error}`);
      if (h.drain.state === 'drained') return h;
      await new Promise((r) => setTimeout(r, DRAIN_POLL_MS));
      return null;
    }, 120_000, 'the drain');
    const drainMs = Date.parse(host.drain.finished_at!) - Date.parse(host.drain.requested_at);
    const mb = host.drain.moved_bytes / 1e6;
    // Where each drained move's time went: queued (created → started), its phases, and in all.
    const db = connectDatabase(databaseUrl, { max: 1 });
    const moves = await db<Array<{ result: { phase_ms?: Record<string, number> } | null; created_at: Date; started_at: Date | null; settled_at: Date | null }>>`
      SELECT result, created_at, started_at, settled_at FROM operations WHERE kind = 'move' AND params->>'drain' IS NOT NULL`;
    await db.end();

    // Destroys last: thousands of files created and deleted slow what this disk does next (ext4
    // without a journal scans past recently deleted inodes), which would blur the figures above.
    for (let i = 0; i < runs; i++) {
      const id = await client.awakeDesktop();
      for (let f = 0; f < 12; f++) await client.put(id, `root/data-${f}.bin`, randomBytes(f === 11 ? 12 * MIB - 8 * MIB : 8 * MIB));
      // A home directory's worth of small files beside the written ones, as a dev setup leaves.
      await client.api('POST', `/v1/desktops/${id}/exec`, { command: `mkdir -p /root/many && cd /root/many && seq ${SMALL_FILES} | xargs touch`, timeout_secs: 60 });
      destroyMs.push(await timed(() => client.api('POST', `/v1/desktops/${id}/destroy?wait=true`)));
      // Its removal runs behind the answer; the next run starts once it is done.
      await until(() => ['a', 'b'].every((h) => readdirSafe(join(options.stateDir, h, 'runtime', 'discarded')).length === 0), 60_000, 'the removal');
      removeMs.push(localRemoveMs(options.stateDir, 12, 8 * MIB + 4 * MIB / 12));
    }

    table(`Moves and drains (median of ${runs}; move downtime with 100 MiB written; ${mb.toFixed(0)} MB drained)`, [
      ['move downtime, awake desktop (baseline: hibernate + wake on one host)', median(moveDowntime), median(restartDowntime), 'ms', '< 500 ms', moveDowntime],
      ['drain rate, 4 desktops, 2 at a time (baseline: cp -a on this disk)', mb / (drainMs / 1000), mb / (copyMs / 1000), 'MB/s', '≥ 500 MB/s'],
      [`destroy, awake desktop with 100 MiB and ${SMALL_FILES} small files (baseline: rm -rf of as much on this disk)`, median(destroyMs), median(removeMs), 'ms', '(lower is better)', destroyMs],
    ]);
    // Where a move's time goes, by the phase each step reaches (scheduler/src/engine/move.ts).
    const names = [...new Set(phases.flatMap((p) => Object.keys(p)))];
    console.log(`move phases, median ms: ${names.map((n) => `${n} ${median(phases.map((p) => p[n] ?? 0)).toFixed(0)}`).join(', ')}`);
    // With a pre-copy (protocol 1.12) most of the written files go before the stop.
    console.log(`move bytes, median MiB: ${Object.keys(bytes[0] ?? {}).map((k) => `${k} ${(median(bytes.map((b) => b[k]!)) / MIB).toFixed(1)}`).join(', ')}`);
    const drainPhases = [...new Set(moves.flatMap((m) => Object.keys(m.result?.phase_ms ?? {})))];
    const took = (from: Date | null, to: Date | null) => (from && to ? to.getTime() - from.getTime() : 0);
    console.log(`drained moves (${moves.length}), median ms: queued ${median(moves.map((m) => took(m.created_at, m.started_at))).toFixed(0)}, `
      + `${drainPhases.map((n) => `${n} ${median(moves.map((m) => m.result?.phase_ms?.[n] ?? 0)).toFixed(0)}`).join(', ')}, `
      + `in all ${median(moves.map((m) => took(m.created_at, m.settled_at))).toFixed(0)}`);
  } finally {
    for (const child of children.reverse()) await child.kill('SIGTERM').catch(() => undefined);
  }
}

/**
 * Reads a small file of the desktop in a loop while `disrupt` runs; answers the longest time
 * between two answered reads, which spans the disruption.
 */
async function readGap(client: Client, id: string, disrupt: () => Promise<void>): Promise<number> {
  let running = true;
  let last = performance.now();
  let longest = 0;
  const reader = (async () => {
    while (running) {
      if (await client.probe(id)) {
        const now = performance.now();
        longest = Math.max(longest, now - last);
        last = now;
      } else {
        await new Promise((r) => setTimeout(r, 2));
      }
    }
  })();
  await disrupt();
  await until(() => client.probe(id), 60_000, 'the desktop to answer again');
  running = false;
  await reader;
  longest = Math.max(longest, performance.now() - last);
  return longest;
}

/** The names in `dir`, none when it does not exist. */
function readdirSafe(dir: string): string[] {
  try {
    return readdirSync(dir);
  } catch {
    return [];
  }
}

/** `rm -rf` of `files` files of `size` bytes each and SMALL_FILES empty ones, written and flushed, in ms. */
function localRemoveMs(dir: string, files: number, size: number): number {
  const target = mkdtempSync(join(dir, 'bench-remove-'));
  for (let i = 0; i < files; i++) writeFileSync(join(target, `f${i}`), randomBytes(Math.round(size)));
  mkdirSync(join(target, 'many'));
  for (let i = 1; i <= SMALL_FILES; i++) writeFileSync(join(target, 'many', String(i)), '');
  execFileSync('sync');
  const started = performance.now();
  execFileSync('rm', ['-rf', target]);
  return performance.now() - started;
}

/** `cp -a` of an agent's desktop directories, in ms. */
function localCopyMs(stateDir: string): number {
  const target = mkdtempSync(join(tmpdir(), 'canto-bench-copy-'));
  try {
    const started = performance.now();
    execFileSync('cp', ['-a', join(stateDir, 'runtime', 'desktops'), target]);
    execFileSync('sync');
    return performance.now() - started;
  } finally {
    rmSync(target, { recursive: true, force: true });
  }
}

class Client {
  constructor(
    private readonly base: string,
    private readonly key: string,
  ) {}

  async api(method: string, path: string, body?: unknown): Promise<unknown> {
    const res = await fetch(this.base + path, {
      method,
      headers: { authorization: `Bearer ${this.key}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${await res.text()}`);
    return res.status === 204 ? null : res.json();
  }

  async admin(method: string, path: string, body?: unknown): Promise<unknown> {
    const res = await fetch(this.base + path, {
      method,
      headers: { authorization: `Bearer ${ADMIN_TOKEN}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${await res.text()}`);
    return res.json();
  }

  async awakeDesktop(): Promise<string> {
    const { id } = (await this.api('POST', '/v1/desktops', { tier: 'small' })) as { id: string };
    await this.api('POST', `/v1/desktops/${id}/wake?wait=true`);
    return id;
  }

  async put(id: string, path: string, body: Buffer): Promise<void> {
    const res = await fetch(`${this.base}/v1/desktops/${id}/files/${path}`, { method: 'PUT', headers: { authorization: `Bearer ${this.key}` }, body });
    if (!res.ok) throw new Error(`PUT ${path}: ${res.status}`);
  }

  /** Whether the desktop answered a read of its probe file. */
  async probe(id: string): Promise<boolean> {
    const res = await fetch(`${this.base}/v1/desktops/${id}/files/root/probe`, { headers: { authorization: `Bearer ${this.key}` } }).catch(() => null);
    if (!res) return false;
    await res.arrayBuffer();
    return res.status === 200;
  }

  /** Waits for the move to settle; answers its result (phase_ms: where its time went). */
  async settled(operationId: string): Promise<{ phase_ms?: Record<string, number>; total_bytes?: number; fetched_bytes?: number; precopied_bytes?: number }> {
    const op = await until(async () => {
      const o = (await this.admin('GET', `/admin/v1/operations/${operationId}`)) as {
        state: string; error: { message: string } | null;
        result: { phase_ms?: Record<string, number>; total_bytes?: number; fetched_bytes?: number; precopied_bytes?: number } | null;
      };
      return o.state === 'succeeded' || o.state === 'failed' ? o : null;
    }, 120_000, 'the move');
    if (op.state === 'failed') throw new Error(`move failed: ${op.error?.message}`);
    return op.result ?? {};
  }
}
