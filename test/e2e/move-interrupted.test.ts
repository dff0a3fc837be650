/**
 * A move interrupted mid-copy, end to end on the real runtime: two `canto scheduler` replicas on
 * one database and two `canto agent` processes (source S and target T), each linked to both
 * replicas. An awake desktop holding 200 MiB of random bytes and a detached process is moved from
 * S to T, and while T is fetching its bytes after the stop one process is crashed (SIGSTOP then
 * SIGKILL of its whole tree); the detached process maps those bytes shared and writable, which
 * keeps them out of the pre-copy, so the copy after the stop carries them and lasts long enough:
 *
 * - the source agent, started again 1.5 s later: the target's copy breaks, the next export is
 *   served by the new source process and the copy goes on from where it stood;
 * - the leader replica: the other replica takes the lease and resumes the move from its phase.
 *
 * Either way the operation settles once, the desktop ends on exactly one host, awake, with the
 * same bytes and (where CRIU makes memory snapshots) the same process running, and no copy of it
 * is left on the host it is not on.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { HOST_ID_FILE } from '../../agent/src/host-identity.js';
import { generateSecretKey } from '../../scheduler/src/crypto/secret-box.js';
import { connectDatabase } from '../../scheduler/src/store/db.js';
import { freshDatabaseUrl } from '../helpers/db.js';
import { api, mintKey, readResponse, until } from '../helpers/scheduler.js';
import { crashTree, freePort, startAgentProcess, startSchedulerProcess, type Child } from '../helpers/processes.js';
import { destroyLeftDesktops, memorySnapshotsHere } from '../helpers/sandbox.js';

const isRoot = process.getuid?.() === 0;
const ADMIN_TOKEN = `test-admin-${randomBytes(16).toString('hex')}`;
const DATA_MIB = 200;
/** Maps the file named shared and writable, and holds the mapping. */
const HOLD_MAPPED = 'import mmap, sys, time; f = open(sys.argv[1], "r+b"); m = mmap.mmap(f.fileno(), 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE); time.sleep(3600)';

describe.skipIf(!isRoot)('a move interrupted by a crash', () => {
  const dir = mkdtempSync(join(tmpdir(), 'canto-move-crash-'));
  const stateOf = { S: join(dir, 'host-s'), T: join(dir, 'host-t') };
  const replicas: Array<Child & { url: string; id: string }> = [];
  const agents: Record<'S' | 'T', Child | null> = { S: null, T: null };
  const hostIds: Record<'S' | 'T', string> = { S: '', T: '' };
  let databaseUrl = '';
  let secretKey = '';
  let key = '';
  let call: ReturnType<typeof api>;
  let sql: ReturnType<typeof connectDatabase>;

  /** The scheduler URLs every agent links to. */
  const schedulerUrls = () => replicas.map((r) => r.url).join(',');

  async function startReplica(id: string): Promise<Child & { url: string; id: string }> {
    const replica = await startSchedulerProcess({
      databaseUrl, port: await freePort(), secretKey,
      extra: { CANTO_REPLICA_ID: id, CANTO_ADMIN_TOKEN: ADMIN_TOKEN, CANTO_HOST_DOWN_MS: '15000' },
    });
    return Object.assign(replica, { id });
  }

  /** Calls the admin API on whichever replica is alive. */
  async function admin(method: string, path: string, body?: unknown) {
    for (const r of replicas) {
      if (r.proc.exitCode !== null || r.proc.signalCode !== null) continue;
      const res = await fetch(r.url + path, {
        method,
        headers: { authorization: `Bearer ${ADMIN_TOKEN}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
        body: body === undefined ? undefined : JSON.stringify(body),
      }).catch(() => null);
      if (res) return readResponse(res);
    }
    throw new Error('no replica answers');
  }

  /** Guest calls, retried while they answer 503 (the desktop between hosts, a link dropped). */
  async function guest(method: string, path: string, body?: unknown) {
    return until(async () => {
      const res = await call(method, path, body);
      return res.status === 503 ? null : res;
    }, 60_000, `${method} ${path} to answer other than 503`);
  }

  async function exec(id: string, command: string): Promise<string> {
    const res = await guest('POST', `/v1/desktops/${id}/exec`, { command, timeout_secs: 120 });
    expect(res.status, res.text).toBe(200);
    expect(res.json.exit_code, res.text).toBe(0);
    return res.json.stdout as string;
  }

  /** Bytes T has fetched of the desktop's own unit so far (its spool in staging), or 0. */
  function spooled(desktopId: string): number {
    const file = join(stateOf.T, 'runtime', 'incoming', desktopId, 'desktop.part');
    return existsSync(file) ? statSync(file).size : 0;
  }

  function holds(host: 'S' | 'T', desktopId: string): boolean {
    return existsSync(join(stateOf[host], 'runtime', 'desktops', desktopId));
  }

  function startAgent(host: 'S' | 'T'): void {
    agents[host] = startAgentProcess(schedulerUrls(), stateOf[host], { CANTO_LOG_LEVEL: 'warn' });
  }

  beforeAll(async () => {
    databaseUrl = await freshDatabaseUrl();
    secretKey = generateSecretKey();
    replicas.push(await startReplica('r1'), await startReplica('r2'));
    startAgent('S');
    startAgent('T');
    sql = connectDatabase(databaseUrl, { max: 1 });
    for (const host of ['S', 'T'] as const) {
      const file = join(stateOf[host], HOST_ID_FILE);
      hostIds[host] = await until(() => (existsSync(file) ? readFileSync(file, 'utf8').trim() || null : null), 20_000, `host id of ${host}`);
    }
    await until(async () => (await sql`SELECT count(*)::int AS n FROM hosts WHERE status = 'ready'`)[0]!.n === 2, 30_000, 'two ready hosts');
    key = await mintKey(databaseUrl, 'movers');
    call = api(replicas[0]!.url, key);
  }, 120_000);

  afterAll(async () => {
    await sql?.end();
    for (const a of Object.values(agents)) await a?.kill('SIGKILL');
    for (const r of replicas) await r.kill('SIGKILL');
    for (const state of Object.values(stateOf)) await destroyLeftDesktops(join(state, 'runtime'));
    rmSync(dir, { recursive: true, force: true });
  }, 120_000);

  /** An awake desktop on S with DATA_MIB of random bytes and a detached process; their sha and id. */
  async function desktopOnS(): Promise<{ id: string; sha: string; processId: string }> {
    expect((await admin('POST', `/admin/v1/hosts/${hostIds.T}/cordon`)).status).toBe(200);
    const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
    const woke = await call('POST', `/v1/desktops/${id}/wake?wait=true`);
    expect(woke.json.state, woke.text).toBe('succeeded');
    expect((await admin('POST', `/admin/v1/hosts/${hostIds.T}/uncordon`)).status).toBe(200);
    expect((await call('GET', `/v1/desktops/${id}`)).json.host_id).toBe(hostIds.S);
    const sha = (await exec(id, `head -c ${DATA_MIB}M /dev/urandom > /root/big && sha256sum /root/big`)).split(' ')[0]!;
    // The detached process maps the file shared and writable, so the pre-copy leaves it out
    // (precopy-files.ts): its bytes move after the stop, and the crash lands in that copy.
    const spawned = await call('POST', `/v1/desktops/${id}/exec`, { command: `python3 -c '${HOLD_MAPPED}' /root/big`, detached: true });
    expect(spawned.status, spawned.text).toBe(202);
    return { id, sha, processId: spawned.json.process_id as string };
  }

  /** Asks for the move to T and waits until T has some but not all of the desktop's bytes. */
  async function moveUntilMidCopy(id: string): Promise<string> {
    const asked = await admin('POST', `/admin/v1/desktops/${id}/move`, { host_id: hostIds.T });
    expect(asked.status, asked.text).toBe(202);
    await until(() => spooled(id) > 0, 60_000, 'the target to start fetching');
    // A crash now lands mid-copy: far fewer bytes are in than the desktop holds.
    expect(spooled(id)).toBeLessThan(DATA_MIB * 1024 * 1024);
    // Visible to operators as it goes: the copy so far, of how much.
    const op = await until(async () => {
      const o = (await admin('GET', `/admin/v1/operations/${asked.json.id}`)).json;
      return o.copied_bytes > 0 ? o : null;
    }, 30_000, 'the copy to show progress');
    expect(op.phase).toBe('stopped');
    expect(op.copied_bytes).toBeLessThan(op.total_bytes);
    return asked.json.id as string;
  }

  async function settled(operationId: string): Promise<any> {
    return until(async () => {
      const op = (await admin('GET', `/admin/v1/operations/${operationId}`)).json;
      return op.state === 'succeeded' || op.state === 'failed' ? op : null;
    }, 240_000, `operation ${operationId} to settle`);
  }

  /** What a user sees after the move: on T, awake, the same bytes, the same process, no copy on S. */
  async function expectMovedWhole(id: string, sha: string, processId: string, operationId: string): Promise<void> {
    const op = await settled(operationId);
    expect(op.state, JSON.stringify(op)).toBe('succeeded');
    expect(op.result.total_bytes).toBeGreaterThan(DATA_MIB * 1024 * 1024);
    const d = (await call('GET', `/v1/desktops/${id}`)).json;
    expect(d.host_id).toBe(hostIds.T);
    expect(d.state).toBe('awake');
    expect((await exec(id, 'sha256sum /root/big')).split(' ')[0]).toBe(sha);
    if (await memorySnapshotsHere()) {
      const status = await guest('GET', `/v1/desktops/${id}/processes/${processId}`);
      expect(status.json.status, status.text).toBe('running');
    }
    // Settled once: one move operation, and it is this one.
    const ops = await sql`SELECT id, state FROM operations WHERE desktop_id = ${id} AND kind = 'move'`;
    expect(ops.map((o) => [o.id, o.state])).toEqual([[operationId, 'succeeded']]);
    // On exactly one host: the source copy goes (at once, or when the source comes back).
    expect(holds('T', id)).toBe(true);
    await until(() => !holds('S', id), 30_000, 'the source copy to go');
  }

  it('completes when the source agent is killed mid-copy and comes back', async () => {
    const { id, sha, processId } = await desktopOnS();
    const operationId = await moveUntilMidCopy(id);
    crashTree(agents.S!.proc.pid!);
    await agents.S!.kill('SIGKILL');
    await new Promise((r) => setTimeout(r, 1500));
    startAgent('S');
    await expectMovedWhole(id, sha, processId, operationId);
  }, 420_000);

  it('completes when the leader replica is killed mid-copy', async () => {
    const { id, sha, processId } = await desktopOnS();
    const operationId = await moveUntilMidCopy(id);
    const [lease] = await sql<Array<{ holder: string }>>`SELECT holder FROM leases WHERE name = 'leader'`;
    const leader = replicas.find((r) => r.id === lease!.holder)!;
    expect(leader).toBeDefined();
    crashTree(leader.proc.pid!);
    await leader.kill('SIGKILL');
    // The survivor serves the API from now on.
    const survivor = replicas.find((r) => r !== leader)!;
    call = api(survivor.url, key);
    await expectMovedWhole(id, sha, processId, operationId);
    const [after] = await sql<Array<{ holder: string }>>`SELECT holder FROM leases WHERE name = 'leader'`;
    expect(after!.holder).toBe(survivor.id);
  }, 420_000);
});
