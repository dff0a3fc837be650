/**
 * A move with a pre-copy (protocol 1.12), end to end on the real runtime: a `canto scheduler`
 * process and two `canto agent` processes (source S, target T). An awake desktop holds 100 MiB
 * in ten files and runs a detached process that appends a numbered line to one of the first five
 * every 100 ms, round robin: while the source pre-copies, those are hot or change as they are
 * read, and may change between the pre-copy and the stop; the other five stay cold throughout
 * and are left out of the copy after the stop.
 *
 * Afterwards, on T: each file is its original bytes (by sha256) followed by exactly the lines
 * its turn gave it, numbered without a gap. A pre-copied file that missed an append made before
 * the stop would show the gap where the appender, restored on T, went on. The process still runs
 * (where CRIU makes memory snapshots), its output goes on growing and its exit code is recorded
 * when it ends, the desktop is awake, and the copy after the stop carried
 * less than the desktop holds. An app in the desktop, exposed through the scheduler's ingress and
 * asked every 25 ms throughout, answers every request: those made while the desktop is between
 * hosts wait for it.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { request } from 'node:http';
import { HOST_ID_FILE } from '../../agent/src/host-identity.js';
import { generateSecretKey } from '../../scheduler/src/crypto/secret-box.js';
import { freshDatabaseUrl } from '../helpers/db.js';
import { api, mintKey, readResponse, until } from '../helpers/scheduler.js';
import { freePort, startAgentProcess, startSchedulerProcess, type Child } from '../helpers/processes.js';
import { destroyLeftDesktops, memorySnapshotsHere } from '../helpers/sandbox.js';

const isRoot = process.getuid?.() === 0;
const ADMIN_TOKEN = `test-admin-${randomBytes(16).toString('hex')}`;
const FILES = 10;
/** Files the appender writes to: f0 … f4. */
const HOT = 5;
const FILE_MIB = 10;

describe.skipIf(!isRoot)('a move that pre-copies an awake desktop', () => {
  const dir = mkdtempSync(join(tmpdir(), 'canto-move-precopy-'));
  const stateOf = { S: join(dir, 'host-s'), T: join(dir, 'host-t') };
  const children: Child[] = [];
  const hostIds = { S: '', T: '' };
  let scheduler: Child & { url: string };
  let databaseUrl = '';
  let call: ReturnType<typeof api>;
  let sourceMetrics = '';
  let ingressPort = 0;

  async function admin(method: string, path: string, body?: unknown) {
    const res = await fetch(scheduler.url + path, {
      method,
      headers: { authorization: `Bearer ${ADMIN_TOKEN}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    return readResponse(res);
  }

  async function exec(id: string, command: string): Promise<string> {
    const res = await until(async () => {
      const r = await call('POST', `/v1/desktops/${id}/exec`, { command, timeout_secs: 120 });
      return r.status === 503 ? null : r;
    }, 60_000, 'exec to answer other than 503');
    expect(res.status, res.text).toBe(200);
    expect(res.json.exit_code, res.text).toBe(0);
    return res.json.stdout as string;
  }

  beforeAll(async () => {
    databaseUrl = await freshDatabaseUrl();
    scheduler = await startSchedulerProcess({
      databaseUrl, port: await freePort(), secretKey: generateSecretKey(),
      extra: { CANTO_ADMIN_TOKEN: ADMIN_TOKEN, CANTO_INGRESS_BASE_URL: 'http://apps.canto.test', CANTO_INGRESS_LISTEN: `127.0.0.1:${(ingressPort = await freePort())}` },
    });
    children.push(scheduler);
    sourceMetrics = `127.0.0.1:${await freePort()}`;
    for (const host of ['S', 'T'] as const) {
      children.push(startAgentProcess(scheduler.url, stateOf[host], { CANTO_LOG_LEVEL: 'warn', ...(host === 'S' ? { CANTO_AGENT_METRICS_LISTEN: sourceMetrics } : {}) }));
    }
    for (const host of ['S', 'T'] as const) {
      const file = join(stateOf[host], HOST_ID_FILE);
      hostIds[host] = await until(() => (existsSync(file) ? readFileSync(file, 'utf8').trim() || null : null), 20_000, `host id of ${host}`);
    }
    await until(async () => {
      const hosts = (await admin('GET', '/admin/v1/hosts')).json.hosts as Array<{ id: string; state: string }>;
      return hosts.filter((h) => h.state === 'ready').length === 2;
    }, 30_000, 'two ready hosts');
    call = api(scheduler.url, await mintKey(databaseUrl, 'precopy'));
  }, 120_000);

  afterAll(async () => {
    for (const c of children.reverse()) await c.kill('SIGKILL');
    for (const state of Object.values(stateOf)) await destroyLeftDesktops(join(state, 'runtime'));
    rmSync(dir, { recursive: true, force: true });
  }, 120_000);

  it('moves every byte as it was at the stop, with the appending process still running', async () => {
    expect((await admin('POST', `/admin/v1/hosts/${hostIds.T}/cordon`)).status).toBe(200);
    const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
    expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).json.state).toBe('succeeded');
    expect((await admin('POST', `/admin/v1/hosts/${hostIds.T}/uncordon`)).status).toBe(200);
    expect((await call('GET', `/v1/desktops/${id}`)).json.host_id).toBe(hostIds.S);

    // Ten files of random bytes; their hashes before any line is appended.
    const made = await exec(id, `mkdir -p /root/data && for i in $(seq 0 ${FILES - 1}); do head -c ${FILE_MIB}M /dev/urandom > /root/data/f$i; done && sha256sum /root/data/f*`);
    const original = new Map(made.trim().split('\n').map((line) => [line.split(/\s+/)[1]!, line.split(/\s+/)[0]!]));
    expect(original.size).toBe(FILES);
    // Line n goes to file n mod 5, every 100 ms, until /root/stop appears.
    // It also counts on its stdout, and exits 7 once stopped: its output and its exit code are
    // what the process API reports after the move.
    const appender = `n=0; while [ ! -e /root/stop ]; do echo "line $n" >> /root/data/f$((n % ${HOT})); echo "n=$n"; n=$((n + 1)); sleep 0.1; done; exit 7`;
    const spawned = await call('POST', `/v1/desktops/${id}/exec`, { command: appender, detached: true });
    expect(spawned.status, spawned.text).toBe(202);
    // Every hot file appended to before the move starts.
    await until(async () => (await exec(id, `grep -c line /root/data/f${HOT - 1} || true`)).trim() !== '0', 30_000, 'every hot file appended to');

    // An app behind a public exposure, asked throughout the move.
    const app = await call('POST', `/v1/desktops/${id}/exec`, {
      command: `setsid node -e "require('http').createServer((q, s) => s.end('up')).listen(8000)" >/dev/null 2>&1 </dev/null &`,
    });
    expect(app.json.exit_code, app.text).toBe(0);
    expect((await call('POST', `/v1/desktops/${id}/ports`, { port: 8000, public: true })).status).toBe(201);
    const viaIngress = () => new Promise<string>((resolve, reject) => {
      // node:http, not fetch: fetch does not send a Host header of our choosing.
      const req = request({ host: '127.0.0.1', port: ingressPort, path: '/', headers: { host: `8000-${id}.apps.canto.test` } }, (res) => {
        let body = '';
        res.on('data', (chunk: Buffer) => (body += chunk.toString()));
        res.on('end', () => resolve(`${res.statusCode} ${body}`));
      });
      req.on('error', reject);
      req.end();
    });
    await until(async () => (await viaIngress()) === '200 up', 10_000, 'the app to answer through the ingress');
    const answers: string[] = [];
    let asking = true;
    const asker = (async () => {
      while (asking) {
        answers.push(await viaIngress().catch((err: Error) => `error ${err.message}`));
        await new Promise((resolve) => setTimeout(resolve, 25));
      }
    })();

    const asked = await admin('POST', `/admin/v1/desktops/${id}/move`, { host_id: hostIds.T });
    expect(asked.status, asked.text).toBe(202);
    const op = await until(async () => {
      const o = (await admin('GET', `/admin/v1/operations/${asked.json.id}`)).json;
      return o.state === 'succeeded' || o.state === 'failed' ? o : null;
    }, 240_000, 'the move to settle');
    expect(op.state, JSON.stringify(op)).toBe('succeeded');
    asking = false;
    await asker;
    expect(answers.filter((a) => a !== '200 up'), 'answers through the ingress other than the app\'s').toEqual([]);
    expect(op.result.phase_ms.precopied).toBeGreaterThanOrEqual(0);
    // At least the five cold files went ahead, and the copy after the stop left them out.
    const coldBytes = (FILES - HOT) * FILE_MIB * 1024 * 1024;
    expect(op.result.precopied_bytes).toBeGreaterThan(coldBytes);
    // Tar streams come in 64 KiB records: leaving out 50 MiB and their headers shortens the
    // stream by exactly 50 MiB or by one record more, depending on where the padding falls.
    expect(op.result.fetched_bytes).toBeLessThanOrEqual(op.result.total_bytes - coldBytes);
    // The copy after the stop fetched with the pre-copy's ticket: the source was asked for no
    // export (its listing was counted once, for the target).
    const metrics = await (await fetch(`http://${sourceMetrics}/metrics`)).text();
    const ran = (name: string) => Number(new RegExp(`^canto_agent_command_duration_seconds_count\\{[^}]*command="${name}"[^}]*\\} (\\d+)`, 'm').exec(metrics)?.[1] ?? 0);
    expect(ran('desktop.precopy.export')).toBe(1);
    expect(ran('desktop.export')).toBe(0);
    // The agent (the built CLI) started its processes from its process spawner, which never died.
    const counted = (name: string) => Number(new RegExp(`^${name} (\\d+)`, 'm').exec(metrics)?.[1] ?? -1);
    expect(counted('canto_agent_processes_started_total\\{via="helper"\\}')).toBeGreaterThan(5);
    expect(counted('canto_agent_spawner_starts_total')).toBe(1);

    const d = (await call('GET', `/v1/desktops/${id}`)).json;
    expect(d.host_id).toBe(hostIds.T);
    expect(d.state).toBe('awake');
    const snapshots = await memorySnapshotsHere();
    const processPath = `/v1/desktops/${id}/processes/${spawned.json.process_id}?tail_bytes=64`;
    if (snapshots) {
      const status = (await call('GET', processPath)).json;
      expect(status.status).toBe('running');
      // Its output goes on growing on T.
      await until(async () => (await call('GET', processPath)).json.stdout_tail !== status.stdout_tail, 10_000, 'the output to grow after the move');
    }
    // Stop the appender, let its last line land, then check every file.
    await exec(id, 'touch /root/stop && sleep 0.3');
    if (snapshots) {
      // Its end is recorded on T, with its exit code.
      const ended = await until(async () => {
        const st = (await call('GET', processPath)).json;
        return st.status === 'running' ? null : st;
      }, 10_000, 'the appender to end');
      expect(ended).toMatchObject({ status: 'exited', exit_code: 7 });
      expect(ended.stdout_tail).toMatch(/n=\d+\n$/);
    }
    for (let i = 0; i < FILES; i++) {
      const path = `/root/data/f${i}`;
      const prefix = (await exec(id, `head -c ${FILE_MIB}M ${path} | sha256sum`)).split(/\s+/)[0];
      expect(prefix, `${path}: its original bytes`).toBe(original.get(path));
      const lines = (await exec(id, `tail -c +$((${FILE_MIB} * 1048576 + 1)) ${path}`)).split('\n').filter(Boolean);
      const numbers = lines.map((l) => Number(/^line (\d+)$/.exec(l)?.[1] ?? NaN));
      if (i >= HOT) expect(numbers, `${path}: never appended to`).toEqual([]);
      // Restored from memory, the appender went on where it stood: its lines to this file, no gap.
      const expected = numbers.map((_, k) => i + k * HOT);
      if (snapshots) expect(numbers, `${path}: every line it was given, in order`).toEqual(expected);
      else expect(numbers.every((n) => n % HOT === i), `${path}: only its own lines`).toBe(true);
      if (i < HOT) expect(numbers.length, `${path}: appended to`).toBeGreaterThan(0);
    }
    // The source copy goes.
    await until(() => !existsSync(join(stateOf.S, 'runtime', 'desktops', id)), 30_000, 'the source copy to go');
  }, 420_000);
});
