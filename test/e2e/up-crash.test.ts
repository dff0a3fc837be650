/**
 * `canto up` killed like a power cut, twice: the whole process tree (scheduler, agent, embedded
 * PostgreSQL, desktops) is stopped and SIGKILLed while a hibernate runs, and `canto up` is started
 * again on the same data directory each time. Both starts succeed on one PostgreSQL server; every
 * desktop ends awake and running, or hibernated, never "awake" with nothing running; every file is
 * intact; and a final Ctrl-C hibernates what is awake and leaves nothing running or mounted (a
 * start after it mounts again what it wakes).
 */
import { afterAll, describe, expect, it } from 'vitest';
import { spawn, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, readdirSync, readlinkSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createSandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { runningPostmaster } from '../../scheduler/src/pg/embedded.js';
import { crashTree, freePort } from '../helpers/processes.js';
import { api, until } from '../helpers/scheduler.js';

const CLI = join(import.meta.dirname, '..', '..', 'dist', 'cli.js');
const isRoot = process.getuid?.() === 0;
const sha = (b: Uint8Array) => createHash('sha256').update(b).digest('hex');

interface Up {
  proc: ChildProcess;
  out(): string;
  exited: Promise<number | null>;
}

describe.skipIf(!isRoot)('canto up after kill -9', () => {
  const dataDir = mkdtempSync(join(tmpdir(), 'canto-up-crash-'));
  const pgData = join(dataDir, 'postgres', 'data');
  const ups: Up[] = [];

  function start(port: number): Up {
    const proc = spawn(process.execPath, [CLI, 'up', '--data-dir', dataDir, '--listen', `127.0.0.1:${port}`], {
      env: {
        PATH: process.env.PATH,
        HOME: '/root',
        CANTO_LOG_LEVEL: 'warn',
        CANTO_INGRESS_LISTEN: '127.0.0.1:0',
        CANTO_AGENT_STREAM_LISTEN: '127.0.0.1:0',
        CANTO_AGENT_INGRESS_LISTEN: '127.0.0.1:0',
        CANTO_AGENT_TRANSFER_LISTEN: '127.0.0.1:0',
        CANTO_AGENT_METRICS_LISTEN: '127.0.0.1:0',
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    proc.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    proc.stderr!.on('data', (d: Buffer) => (out += d.toString()));
    const up = { proc, out: () => out, exited: new Promise<number | null>((resolve) => proc.once('exit', (code) => resolve(code))) };
    ups.push(up);
    return up;
  }

  async function started(up: Up): Promise<void> {
    await until(() => {
      if (up.proc.exitCode !== null) throw new Error(`canto up exited ${up.proc.exitCode}:\n${up.out()}`);
      return up.out().includes('Press Ctrl-C');
    }, 90_000, 'canto up');
  }

  /** PostgreSQL processes of this data directory that nobody started: orphans of a crash. */
  function clusterProcesses(): number[] {
    return readdirSync('/proc').filter((n) => /^\d+$/.test(n)).map(Number).filter((pid) => {
      try {
        return readFileSync(`/proc/${pid}/comm`, 'utf8').trim() === 'postgres' && readlinkSync(`/proc/${pid}/cwd`) === pgData;
      } catch {
        return false;
      }
    });
  }

  function postmasters(): number[] {
    return clusterProcesses().filter((pid) => {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      return readFileSync(`/proc/${ppid}/comm`, 'utf8').trim() !== 'postgres';
    });
  }

  afterAll(async () => {
    for (const up of ups) if (up.proc.exitCode === null) crashTree(up.proc.pid!);
    for (const pid of clusterProcesses()) process.kill(pid, 'SIGKILL');
    const runtime = join(dataDir, 'agent', 'runtime');
    if (existsSync(runtime)) {
      const cleaner = await createSandboxDriver({ stateDir: runtime });
      for (const d of await cleaner.list()) await cleaner.destroy(d.desktopId);
      await cleaner.close();
    }
    rmSync(dataDir, { recursive: true, force: true });
  }, 120_000);

  it('restarts cleanly twice after kill -9 of the whole tree mid-hibernate, and loses nothing', async () => {
    const port = await freePort();
    const first = start(port);
    await started(first);
    const key = /API key:\s+(svc_sk_\S+)/.exec(first.out())![1]!;
    const base = `http://127.0.0.1:${port}`;
    const call = api(base, key);
    const auth = { authorization: `Bearer ${key}` };

    const files = new Map<string, string>();
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) {
      const id: string = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id;
      ids.push(id);
      expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).json.state).toBe('succeeded');
      const body = randomBytes(1024 * 1024);
      expect((await fetch(`${base}/v1/desktops/${id}/files/root/data.bin`, { method: 'PUT', headers: auth, body })).status).toBe(204);
      files.set(id, sha(body));
    }

    /** Every desktop ends awake and running, or hibernated; never awake with nothing running. */
    const settledStates = async (c: ReturnType<typeof api>) => {
      // What the last look saw, for the failure message: a state alone does not say why.
      let seen = '';
      return until(async () => {
        const states: string[] = [];
        seen = '';
        for (const id of ids) {
          const d = (await c('GET', `/v1/desktops/${id}`)).json;
          seen += ` ${id}: ${d.state}`;
          if (d.state === 'awake') {
            const exec = await c('POST', `/v1/desktops/${id}/exec`, { command: 'true' });
            if (exec.status !== 200) {
              seen += ` (exec ${exec.status} ${JSON.stringify(exec.json)})`;
              return null;
            }
          } else if (d.state !== 'hibernated') {
            return null;
          }
          states.push(d.state);
        }
        return states;
      }, 60_000, 'every desktop awake-and-running or hibernated').catch(async (err: unknown) => {
        // What the host's runtime says of each desktop, and the services' log without the refusals.
        const driver = await createSandboxDriver({ stateDir: join(dataDir, 'agent', 'runtime') });
        const held = await driver.list().finally(() => driver.close());
        const log = up.out().split('\n').filter((line) => !line.includes('command refused')).join('\n');
        throw new Error(`${err instanceof Error ? err.message : String(err)}; last seen:${seen}; runtime: ${JSON.stringify(held)}\n${log.slice(-8000)}`);
      });
    };

    const crashMidHibernate = async (up: Up, c: ReturnType<typeof api>, id: string) => {
      const op = (await c('POST', `/v1/desktops/${id}/hibernate`)).json;
      await until(async () => ['running', 'succeeded'].includes((await c('GET', `/v1/operations/${op.id}`)).json.state), 10_000, 'the hibernate to run');
      crashTree(up.proc.pid!);
      await up.exited;
      return op.id as string;
    };

    let up = first;
    let c = call;
    for (const round of [1, 2]) {
      const opId = await crashMidHibernate(up, c, ids[round - 1]!);
      // A server may be left behind when only canto up dies; here the whole tree did.
      up = start(port);
      await started(up);
      expect(up.out(), `start ${round + 1}`).toContain('Canto is up.');
      expect(postmasters(), 'one PostgreSQL server').toHaveLength(1);
      expect(runningPostmaster(pgData)).toBe(postmasters()[0]);
      c = api(base, key);
      const op = await until(async () => {
        const o = (await c('GET', `/v1/operations/${opId}`)).json;
        return o.state === 'succeeded' || o.state === 'failed' ? o : null;
      }, 60_000, 'the interrupted hibernate to settle');
      expect(op.state).toBe('succeeded');
      const states = await settledStates(c);
      expect(states.every((s) => s === 'hibernated' || s === 'awake')).toBe(true);
      // Wake everything and check every byte.
      for (const id of ids) {
        if ((await c('GET', `/v1/desktops/${id}`)).json.state === 'hibernated') {
          expect((await c('POST', `/v1/desktops/${id}/wake?wait=true`)).json.state, `wake ${id} after start ${round + 1}`).toBe('succeeded');
        }
        const read = await fetch(`${base}/v1/desktops/${id}/files/root/data.bin`, { headers: auth });
        const got = new Uint8Array(await read.arrayBuffer());
        expect(read.status, `${id}'s file after start ${round + 1}: ${read.status === 200 ? '' : Buffer.from(got).toString()}`).toBe(200);
        expect(sha(got), `${id}'s file after start ${round + 1}`).toBe(files.get(id));
      }
    }

    // Ctrl-C: what is awake is hibernated, then everything stops; nothing is left running.
    up.proc.kill('SIGINT');
    expect(await up.exited).toBe(0);
    expect(up.out()).toContain(`hibernated ${ids.length} of ${ids.length} desktop(s)`);
    expect(clusterProcesses()).toEqual([]);
    const driver = await createSandboxDriver({ stateDir: join(dataDir, 'agent', 'runtime') });
    try {
      expect((await driver.list()).filter((d) => d.running)).toEqual([]);
    } finally {
      await driver.close();
    }
    // Nor anything mounted: the data directory could go. The next start mounts what it wakes.
    const mountedHere = () => readFileSync('/proc/self/mountinfo', 'utf8').split('\n').filter((line) => line.split(' ')[4]?.startsWith(`${dataDir}/`));
    expect(mountedHere()).toEqual([]);
    up = start(port);
    await started(up);
    c = api(base, key);
    expect((await c('POST', `/v1/desktops/${ids[0]}/wake?wait=true`)).json.state).toBe('succeeded');
    const again = await fetch(`${base}/v1/desktops/${ids[0]}/files/root/data.bin`, { headers: auth });
    expect(sha(new Uint8Array(await again.arrayBuffer()))).toBe(files.get(ids[0]!));
    up.proc.kill('SIGINT');
    expect(await up.exited).toBe(0);
    expect(mountedHere()).toEqual([]);
  }, 300_000);
});
