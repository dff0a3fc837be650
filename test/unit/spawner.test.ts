/**
 * The agent's process spawner (agent/src/runtime/sandbox/host/spawner.ts with the helper built
 * from agent/native/canto-spawn.c): processes started through it behave as Node's spawn would
 * start them (stdio, exit codes, signals, sessions, environment, errors), the helper takes
 * requests from the agent alone, and a helper killed under running children loses none of them.
 * Real processes throughout.
 */
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { closeSync, existsSync, openSync } from 'node:fs';
import { chmod, mkdtemp, readFile, rm, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { connect } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { procStat } from '../../agent/src/runtime/sandbox/host/host-procs.js';
import { helperPath, requestFrame, spawnerStats, runningSpawner, spawnProcess, type SpawnedProcess, type SpawnOptions } from '../../agent/src/runtime/sandbox/host/spawner.js';
import { sweepStaleSockets } from '../../agent/src/runtime/sandbox/host/spawner-sockets.js';
import { JOIN_FAILED } from '../../agent/src/runtime/sandbox/host/cgroups.js';
import { AgentMetrics } from '../../agent/src/observability.js';
import { until } from '../helpers/wait.js';
import { runWithoutSpawner, runWithStray, SPAWNER } from '../helpers/spawner-off.js';
import { STRAY_CHILD_FD } from '../helpers/processes.js';

let dir: string;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'canto-spawner-'));
});

afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

async function collect(child: SpawnedProcess): Promise<{ out: Buffer; err: string; code: number | null; signal: string | null }> {
  const out: Buffer[] = [];
  let err = '';
  child.stdout?.on('data', (c: Buffer) => out.push(c));
  child.stderr?.on('data', (c: Buffer) => (err += c.toString()));
  const [code, signal] = (await once(child, 'close')) as [number | null, string | null];
  return { out: Buffer.concat(out), err, code, signal };
}

describe('the process spawner', () => {
  it('starts children from its helper, not by forking this process', async () => {
    const helper = await runningSpawner();
    expect(helper).not.toBeNull();
    const before = spawnerStats();
    const child = await spawnProcess('sleep', ['5'], { stdio: ['ignore', 'ignore', 'ignore'] });
    expect(spawnerStats()).toEqual({ ...before, helper: before.helper + 1 });
    const st = await procStat(child.pid!);
    expect(st?.ppid).toBe(helper!.pid);
    expect(st?.ppid).not.toBe(process.pid);
    child.kill('SIGKILL');
    await once(child, 'close');
  });

  it('connects stdin, stdout and stderr, and reports the exit code after the output', async () => {
    const child = await spawnProcess('sh', ['-c', 'cat; echo err >&2; exit 3'], { stdio: ['pipe', 'pipe', 'pipe'] });
    child.stdin!.end('from stdin\n');
    const got = await collect(child);
    expect(got).toEqual({ out: Buffer.from('from stdin\n'), err: 'err\n', code: 3, signal: null });
    expect(child.exitCode).toBe(3);
  });

  it('streams more than any socket buffer holds, both ways, byte for byte', async () => {
    const data = Buffer.alloc(8 << 20);
    for (let i = 0; i < data.length; i += 4096) data.writeUInt32LE((i * 2654435761) >>> 0, i);
    const child = await spawnProcess('cat', [], { stdio: ['pipe', 'pipe', 'ignore'] });
    child.stdin!.end(data);
    const got = await collect(child);
    expect(createHash('sha256').update(got.out).digest('hex')).toBe(createHash('sha256').update(data).digest('hex'));
    expect(got.code).toBe(0);
  });

  it('reports an exit that arrives with the start to listeners attached once the start resolves', async () => {
    expect(await runningSpawner()).not.toBeNull();
    const starting = spawnProcess('sleep', ['0.05'], { stdio: ['ignore', 'ignore', 'ignore'] });
    // A few turns for the request to go out, then the event loop is held while the process
    // starts and ends: both reports arrive in one read.
    for (let i = 0; i < 5; i++) await new Promise((resolve) => setImmediate(resolve));
    const until = performance.now() + 300;
    while (performance.now() < until) {
      // busy
    }
    const child = await starting;
    expect(await once(child, 'close')).toEqual([0, null]);
  });

  it('ends an output stream for its consumer when the child ended without output before the start resolved', async () => {
    expect(await runningSpawner()).not.toBeNull();
    const starting = spawnProcess('true', [], { stdio: ['ignore', 'pipe', 'ignore'] });
    // The connections are being made (a few turns of promises); the event loop is then held
    // while the helper starts the child and the child ends: its output's end is there before
    // the connection is seen to be made.
    for (let i = 0; i < 20; i++) await Promise.resolve();
    const until = performance.now() + 300;
    while (performance.now() < until) {
      // busy
    }
    const child = await starting;
    await new Promise((resolve) => setTimeout(resolve, 20));
    const ended = once(child.stdout!, 'end');
    child.stdout!.resume();
    await ended;
    expect(await once(child, 'close')).toEqual([0, null]);
  });

  it('keeps the output of a process that has exited for a reader that comes later, and closes once it is read', async () => {
    const child = await spawnProcess('sh', ['-c', 'echo some output; echo more >&2'], { stdio: ['ignore', 'pipe', 'pipe'] });
    const closed = once(child, 'close');
    expect(await once(child, 'exit')).toEqual([0, null]);
    // A caller that hands the stream on after an await (a unit's tar stream, to its HTTP answer).
    await new Promise((resolve) => setTimeout(resolve, 50));
    const got = await collect(child);
    expect({ out: got.out.toString(), err: got.err }).toEqual({ out: 'some output\n', err: 'more\n' });
    expect(await closed).toEqual([0, null]);
  });

  it('starts a burst of processes at once, each with its own three streams (their connections come before their requests)', async () => {
    const outputs = await Promise.all(
      Array.from({ length: 300 }, async (_, i) => {
        const child = await spawnProcess('sh', ['-c', `read line; echo "$line ${i}"; echo ${i} >&2`], { stdio: ['pipe', 'pipe', 'pipe'] });
        child.stdin!.end('from\n');
        const got = await collect(child);
        return `${got.code} ${got.out.toString().trim()} ${got.err.trim()}`;
      }),
    );
    expect(outputs).toEqual(Array.from({ length: 300 }, (_, i) => `0 from ${i} ${i}`));
  }, 30_000);

  it('gives the child exactly the environment and directory asked for, and looks the file up on its PATH', async () => {
    const bin = join(dir, 'bin');
    await rm(bin, { recursive: true, force: true });
    await writeFile(join(dir, 'only-here'), '#!/bin/sh\nenv | sort; pwd\n');
    await chmod(join(dir, 'only-here'), 0o755);
    const child = await spawnProcess('only-here', [], { stdio: ['ignore', 'pipe', 'pipe'], env: { PATH: `${dir}:/usr/bin:/bin`, A: 'one two' }, cwd: '/tmp' });
    const got = await collect(child);
    expect(got.out.toString().split('\n').filter((l) => l !== '' && !l.startsWith('PWD=') && !l.startsWith('SHLVL=') && !l.startsWith('_='))).toEqual([
      'A=one two',
      `PATH=${dir}:/usr/bin:/bin`,
      '/tmp',
    ]);
  });

  it('leads a session of its own only when detached', async () => {
    const detached = await spawnProcess('sleep', ['5'], { stdio: ['ignore', 'ignore', 'ignore'], detached: true });
    const attached = await spawnProcess('sleep', ['5'], { stdio: ['ignore', 'ignore', 'ignore'] });
    const [d, a] = [await procStat(detached.pid!), await procStat(attached.pid!)];
    expect(d?.session).toBe(detached.pid);
    expect(d?.pgid).toBe(detached.pid);
    expect(a?.session).not.toBe(attached.pid);
    // A detached child's group can be signalled as a whole, as the agent does.
    const exits = Promise.all([once(detached, 'exit'), once(attached, 'exit')]);
    process.kill(-detached.pid!, 'SIGKILL');
    attached.kill('SIGTERM');
    expect(await exits).toEqual([
      [null, 'SIGKILL'],
      [null, 'SIGTERM'],
    ]);
  });

  it('reports a file that does not exist as Node does: an error, then close', async () => {
    const child = await spawnProcess(join(dir, 'missing'), [], { stdio: ['pipe', 'pipe', 'pipe'] });
    const events: string[] = [];
    const closed = new Promise<void>((resolve) => child.once('close', () => resolve()));
    child.once('error', (err: NodeJS.ErrnoException) => events.push(`error ${err.code}`));
    child.once('close', () => events.push('close'));
    await closed;
    expect(events).toEqual(['error ENOENT', 'close']);
    expect(child.pid).toBeUndefined();
  });

  it('refuses a NUL in anything it would pass, as Node does, before anything starts', async () => {
    const marker = join(dir, 'nul-was-run');
    // Were it framed, the tail after the NUL would become the started process's first variable.
    const cases: Array<[string, string[], SpawnOptions]> = [
      ['sh', ['-c', `touch ${marker}\0LD_PRELOAD=/tmp/x.so`], { stdio: ['ignore', 'ignore', 'ignore'] }],
      [`sh\0x`, ['-c', `touch ${marker}`], { stdio: ['ignore', 'ignore', 'ignore'] }],
      ['sh', ['-c', `touch ${marker}`], { stdio: ['ignore', 'ignore', 'ignore'], env: { PATH: '/usr/bin:/bin\0LD_PRELOAD=/tmp/x.so' } }],
      ['sh', ['-c', `touch ${marker}`], { stdio: ['ignore', 'ignore', 'ignore'], cwd: '/\0x' }],
    ];
    for (const [file, args, options] of cases) {
      await expect(spawnProcess(file, args, options)).rejects.toMatchObject({ code: 'ERR_INVALID_ARG_VALUE' });
      expect(() => requestFrame(1, file, args, options, [0, 0, 0], 1)).toThrow(/without null bytes/);
    }
    await new Promise((resolve) => setTimeout(resolve, 200));
    await expect(readFile(marker)).rejects.toThrow(/ENOENT/);
  });

  it('refuses a frame whose strings outrun its counts, which is what a NUL inside one would make', async () => {
    const helper = (await runningSpawner())!;
    const marker = join(dir, 'shifted-was-run');
    // Two variables framed, one counted: the first would be the started process's environment,
    // the other left over. (requestFrame refuses the NUL that would make this; the helper checks too.)
    const frame = requestFrame(999_999, '/bin/sh', ['-c', `touch ${marker}`], { stdio: ['ignore', 'ignore', 'ignore'], env: { LD_PRELOAD: '/nonexistent/x.so', X: 'y' } }, [0, 0, 0], 1);
    frame.writeUInt32LE(1, 20);
    const socket = connect(helper.address);
    socket.on('error', () => undefined);
    socket.write(frame);
    await new Promise((resolve) => setTimeout(resolve, 500));
    socket.destroy();
    await expect(readFile(marker)).rejects.toThrow(/ENOENT/);
  });

  it('takes requests from the agent alone: another process connecting to its socket starts nothing', async () => {
    const helper = (await runningSpawner())!;
    const marker = join(dir, 'intruder-was-here');
    const frame = requestFrame(1, 'touch', [marker], { stdio: ['ignore', 'ignore', 'ignore'] }, [0, 0, 0], 1);
    const intruder = spawn(process.execPath, [
      '-e',
      `const s = require('node:net').connect(process.argv[1], () => s.write(Buffer.from(process.argv[2], 'hex')));
       s.on('close', () => { console.log('closed'); process.exit(0); }); s.on('error', () => {}); s.resume();`,
      helper.address,
      frame.toString('hex'),
    ]);
    let said = '';
    intruder.stdout.on('data', (c: Buffer) => (said += c.toString()));
    await once(intruder, 'close');
    expect(said.trim()).toBe('closed');
    await expect(readFile(marker)).rejects.toThrow(/ENOENT/);
    // The same request from the agent does start it.
    const child = await spawnProcess('touch', [marker], { stdio: ['ignore', 'ignore', 'ignore'] });
    await once(child, 'close');
    expect((await readFile(marker)).length).toBe(0);
  });

  it('keeps children running when the helper is killed, reports their end, and starts a new helper', async () => {
    const old = (await runningSpawner())!;
    const child = await spawnProcess('sh', ['-c', 'sleep 0.5; echo late'], { stdio: ['ignore', 'pipe', 'ignore'] });
    const got = collect(child);
    process.kill(old.pid, 'SIGKILL');
    // The child lives on (adopted by init) and its output still arrives; its exit status is unknown.
    expect(await got).toEqual({ out: Buffer.from('late\n'), err: '', code: null, signal: null });
    await until(async () => (await runningSpawner())?.pid !== old.pid, 5_000, 'a new helper');
    // The killed helper could not remove its socket's directory; the next one's start did.
    expect(existsSync(dirname(old.address))).toBe(false);
    // A sweep leaves a live helper's socket alone.
    const live = (await runningSpawner())!;
    expect(await sweepStaleSockets()).not.toContain(dirname(live.address));
    expect(existsSync(live.address)).toBe(true);
    const next = await spawnProcess('true', [], { stdio: ['ignore', 'ignore', 'ignore'] });
    expect(await once(next, 'close')).toEqual([0, null]);
    expect((await procStat(next.pid!)) === null).toBe(true);
  });
});

it('sweeps a socket directory that has no socket only once it is older than a helper takes to start', async () => {
  const root = await mkdtemp(join(tmpdir(), 'canto-sweep-'));
  try {
    // Another agent's helper, starting: its directory is made, its socket not yet bound.
    const starting = await mkdtemp(join(root, 'canto-spawn-'));
    // A helper that died before it listened, long ago.
    const died = await mkdtemp(join(root, 'canto-spawn-'));
    const longAgo = new Date(Date.now() - 120_000);
    await utimes(died, longAgo, longAgo);
    expect(await sweepStaleSockets(root)).toEqual([died]);
    expect(existsSync(starting)).toBe(true);
    expect(existsSync(died)).toBe(false);
  } finally {
    await rm(root, { recursive: true, force: true });
  }
});

it('starts processes with Node spawn when told to (CANTO_AGENT_SPAWN_HELPER=off)', async () => {
  const got = await runWithoutSpawner<{ helper: unknown; ppid: number; self: number }>(dir, 'fallback', `import { spawnProcess, runningSpawner } from ${SPAWNER};
    const child = await spawnProcess('sh', ['-c', 'echo $PPID'], { stdio: ['ignore', 'pipe', 'ignore'] });
    let out = ''; child.stdout.on('data', (c) => (out += c)); child.on('close', async () => console.log(JSON.stringify({ helper: await runningSpawner(), ppid: Number(out), self: process.pid })));`);
  expect(got.helper).toBeNull();
  expect(got.ppid).toBe(got.self);
});

describe('descriptors the agent inherited (a leaking supervisor or shell)', () => {
  /** The targets of the descriptors `ls -l /proc/self/fd` listed. */
  const targets = (listing: string) => [...listing.matchAll(/ -> (.*)$/gm)].map((m) => m[1]);

  it("reach none of the spawner's children, though the agent holds them", async () => {
    const stray = join(dir, 'supervisor.log');
    const fd = openSync(stray, 'a');
    try {
      const got = await runWithStray<{ held: string; listing: string }>(dir, 'stray', `import { readlinkSync } from 'node:fs';
        import { spawnProcess } from ${SPAWNER};
        const child = await spawnProcess('ls', ['-l', '/proc/self/fd'], { stdio: ['ignore', 'pipe', 'ignore'] });
        let out = ''; child.stdout.on('data', (c) => (out += c));
        child.on('close', () => console.log(JSON.stringify({ held: readlinkSync('/proc/self/fd/${STRAY_CHILD_FD}'), listing: out })));`, fd);
      expect(got.held).toBe(stray);
      expect(targets(got.listing).length).toBeGreaterThanOrEqual(3);
      expect(targets(got.listing)).not.toContain(stray);
    } finally {
      closeSync(fd);
    }
  });

  it('reach no program started through `--clean FIRST`, from FIRST up; those below it are handed on', async () => {
    const [given, leaked] = [join(dir, 'given'), join(dir, 'leaked')];
    const fds = [openSync(given, 'a'), openSync(leaked, 'a')];
    try {
      const child = spawn(helperPath()!, ['--clean', '5', 'ls', '-l', '/proc/self/fd'], { stdio: ['ignore', 'pipe', 'ignore', 'ignore', fds[0]!, 'ignore', 'ignore', fds[1]!] });
      let out = '';
      child.stdout!.on('data', (c: Buffer) => (out += c.toString()));
      expect(await once(child, 'close')).toEqual([0, null]);
      expect(targets(out)).toContain(given);
      expect(targets(out)).not.toContain(leaked);
    } finally {
      fds.forEach((fd) => closeSync(fd));
    }
  });
});

it("counts the processes started each way, and the spawners started, in the agent's metrics", async () => {
  const metrics = new AgentMetrics();
  let counts = { helper: 7, node: 2, helperStarts: 1 };
  metrics.attach({ linkedReplicas: () => [], leaderEpoch: () => 0, driver: { list: async () => [] }, processes: () => counts });
  const text = async () => (await metrics.registry.getSingleMetricAsString('canto_agent_processes_started_total')) + '\n' + (await metrics.registry.getSingleMetricAsString('canto_agent_spawner_starts_total'));
  expect(await text()).toMatch(/via="helper"} 7\n[^]*via="node"} 2\n[^]*spawner_starts_total 1/);
  counts = { helper: 9, node: 2, helperStarts: 2 };
  expect(await text()).toMatch(/via="helper"} 9\n[^]*via="node"} 2\n[^]*spawner_starts_total 2/);
});

describe("the spawner's keeper mode (a restore's CRIU runs under it)", () => {
  const keeper = (args: string[]) => {
    const started = performance.now();
    const child = spawn(helperPath()!, ['--keep', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (c: Buffer) => (out += c.toString()));
    child.stderr.on('data', (c: Buffer) => (err += c.toString()));
    return once(child, 'close').then(([code]) => ({ code: code as number, out, err, ms: performance.now() - started }));
  };

  it("reports the program's exit code on stdout and exits with it", async () => {
    expect(await keeper(['0', '--', '/bin/sh', '-c', 'exit 3'])).toMatchObject({ code: 3, out: 'criu-exit 3\n' });
    expect(await keeper(['0', '--', '/bin/sh', '-c', 'kill -9 $$'])).toMatchObject({ code: 137, out: 'criu-exit 137\n' });
  });

  it('adopts what the program leaves behind and stays until it is gone, as the reaper of a restored tree must', async () => {
    const marker = join(dir, 'orphan-ppid');
    // The program's child outlives it: the keeper, a subreaper, becomes its parent.
    const got = await keeper(['0', '--', '/bin/sh', '-c', `(sleep 0.3; echo $PPID > ${marker}) & exit 0`]);
    expect(got).toMatchObject({ code: 0, out: 'criu-exit 0\n' });
    expect(got.ms).toBeGreaterThanOrEqual(300);
    expect(Number((await readFile(marker, 'utf8')).trim())).not.toBe(1);
  });

  it('runs nothing when a cgroup cannot be joined, and says so as the shell join does', async () => {
    const marker = join(dir, 'ran-unlimited');
    const got = await keeper(['1', join(dir, 'no-such-group'), '--', 'touch', marker]);
    expect(got.code).toBe(97);
    expect(got.err).toBe(`${JOIN_FAILED} ${join(dir, 'no-such-group')}\n`);
    expect(got.out).toBe('');
    await expect(readFile(marker)).rejects.toThrow(/ENOENT/);
  });
});

describe.skipIf(helperPath() === null)('a burst of starts through the helper', () => {
  it('starts every one of a burst of piped processes asked at once, none left waiting', async () => {
    // Three connections each, asked in one turn: far more than a backlog of 128 (musl's SOMAXCONN)
    // holds. A refused connection left its start waiting for good.
    const runs = await Promise.all(Array.from({ length: 1000 }, async (_, i) => {
      const child = await spawnProcess('/bin/sh', ['-c', `echo ${i}`], { stdio: ['pipe', 'pipe', 'pipe'] });
      child.stdin?.end();
      return collect(child);
    }));
    expect(runs.map((r) => r.code)).toEqual(runs.map(() => 0));
    expect(runs.map((r) => r.out.toString())).toEqual(runs.map((_, i) => `${i}\n`));
  }, 60_000);
});

