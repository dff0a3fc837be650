/**
 * The two ways into a desktop's guest for cold calls (guest-entry.ts): the spawner binary's native
 * modes (agent/native/guest-enter.c) and the chain of programs they replace (a shell joining the
 * cgroups, the Perl exec relay, nsenter, setpriv, setsid). Both must give a command the same
 * world: namespaces, root, working directory, bounding set, cgroups, session, environment, stdio
 * and exit codes. Needs root and the built spawner binary (`npx tsup`).
 */
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createSandboxDriver, type SandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { JOIN_FAILED } from '../../agent/src/runtime/sandbox/host/cgroups.js';
import { helperPath } from '../../agent/src/runtime/sandbox/host/spawner.js';
import { coldExecIsQuick, ENTER_FAILED, enterArgv, execArgv, type GuestEntry } from '../../agent/src/runtime/sandbox/guest/guest-entry.js';
import { favorDynamicCgroups } from '../../agent/src/runtime/sandbox/host/cgroup-migrations.js';
import { guestExec } from '../../agent/src/runtime/sandbox/guest/guest-exec.js';
import { GUEST_ENV } from '../../agent/src/runtime/sandbox/guest/guest-init.js';
import { newId } from '../../shared/src/ids.js';
import { failure } from '../helpers/agent-failure.js';
import { isRoot } from '../helpers/sandbox.js';
import { until } from '../helpers/wait.js';

const helper = helperPath();
if (!isRoot || helper === null) console.warn('guest entry tests skipped: they need root and the built spawner binary');

/** Everything about a process's place in the guest that both ways must agree on (its own pid aside). */
const PROBE = [
  'grep -E "^(Uid|CapEff|CapBnd|CapPrm):" /proc/self/status',
  'hostname', 'pwd', 'ulimit -n',
  // A session of its own: the shell's session id is its own pid.
  'test "$(cut -d" " -f6 /proc/self/stat)" = "$$" && echo own-session || echo shared-session',
  'sort /proc/self/cgroup',
  'for n in pid mnt net ipc uts time_for_children; do readlink /proc/self/ns/$n; done',
  'ls /', 'env | sort',
].join('; ');

describe.skipIf(!isRoot || helper === null)('entering a guest natively and through the chain of programs', () => {
  let base: string;
  let driver: SandboxDriver;
  const logged: string[] = [];
  const id = newId('desktop');
  let entry: GuestEntry;

  /** Runs `fn` with the native modes on or off. */
  async function way<T>(native: boolean, fn: () => Promise<T>): Promise<T> {
    const before = process.env.CANTO_AGENT_NATIVE_ENTRY;
    process.env.CANTO_AGENT_NATIVE_ENTRY = native ? 'on' : 'off';
    try {
      return await fn();
    } finally {
      if (before === undefined) delete process.env.CANTO_AGENT_NATIVE_ENTRY;
      else process.env.CANTO_AGENT_NATIVE_ENTRY = before;
    }
  }

  const exec = (command: string, extra: { stdin?: string; privileged?: boolean; initPid?: number } = {}) =>
    guestExec({
      desktopId: id, initPid: extra.initPid ?? entry.initPid, nsenterPath: entry.nsenterPath, command, timeoutMs: 10_000,
      maxOutputBytes: 1 << 20, sourceEnv: true,
      ...(extra.stdin === undefined ? {} : { stdin: extra.stdin }),
      ...(extra.privileged === undefined ? {} : { privileged: extra.privileged }),
    });

  /** `argv` started as the agent starts a cold helper; its exit code and output. */
  function run([file, args]: [string, string[]]): Promise<{ code: number | null; out: string; err: string }> {
    return new Promise((resolve, reject) => {
      const child = spawn(file, args, { env: { ...GUEST_ENV }, stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '';
      let err = '';
      child.stdout.on('data', (c: Buffer) => (out += c.toString()));
      child.stderr.on('data', (c: Buffer) => (err += c.toString()));
      child.once('error', reject);
      child.once('close', (code) => resolve({ code, out, err }));
    });
  }

  beforeAll(async () => {
    base = await mkdtemp(join(tmpdir(), 'canto-entry-test-'));
    // Its log goes with a failed hibernate or start: the reason for a cold stop is only there.
    const log = (msg: string, fields?: object, level?: 'warn') => void logged.push(`${level ?? 'info'}: ${msg} ${JSON.stringify(fields ?? {})}`);
    driver = await createSandboxDriver({ stateDir: join(base, 'state'), log });
    await driver.prepare(id, 'small');
    await driver.start({ desktopId: id, tier: 'small', firstBoot: { env: { GREETING: 'entered' }, setupScript: null } });
    const init = JSON.parse(await readFile(join(base, 'state', 'desktops', id, 'run', 'init.json'), 'utf8')) as { pid: number };
    const nsenterPath = ['/usr/bin/nsenter', '/bin/nsenter'].find((p) => existsSync(p))!;
    entry = { desktopId: id, initPid: init.pid, nsenterPath, workdir: '/root', guestCaps: true };
  });

  afterAll(async () => {
    await driver?.destroy(id).catch(() => undefined);
    await driver?.close();
    if (base) await rm(base, { recursive: true, force: true });
  });

  it('picks the native modes where the binary is built, and the chain when they are turned off', async () => {
    expect(await way(true, async () => execArgv(entry, ['true'])[0])).toBe(helper);
    expect(await way(true, async () => enterArgv(entry, ['true'])[0])).toBe(helper);
    expect(await way(false, async () => execArgv(entry, ['true'])[0])).toBe('/bin/sh');
    expect(await way(false, async () => enterArgv(entry, ['true'])[0])).toBe('/bin/sh');
  });

  it('gives an exec the same world both ways: namespaces, root, directory, capabilities, cgroups, session, env', async () => {
    const native = await way(true, () => exec(PROBE));
    const chain = await way(false, () => exec(PROBE));
    expect(native).toEqual(chain);
    expect(native.exitCode).toBe(0);
    // What that world is: the guest's bounding set only, the desktop's groups, its own session.
    expect(native.stdout).toMatch(/^CapBnd:\t00000000a00425fb$/m);
    expect(native.stdout).toContain(`cpu:/canto/${id}\n`);
    expect(native.stdout).toContain('own-session');
    expect(native.stdout).toContain('GREETING=entered');
    expect(native.stdout.split('\n')).toContain('/root');

    const privileged = await way(true, () => exec('grep CapBnd /proc/self/status', { privileged: true }));
    expect(privileged).toEqual(await way(false, () => exec('grep CapBnd /proc/self/status', { privileged: true })));
    expect(privileged.stdout).not.toContain('a00425fb');
  });

  it('passes input, output, exit codes and signals the same way both ways', async () => {
    const cases: Array<[string, { stdin?: string }]> = [
      ['cat; echo done', { stdin: 'some input\n' }],
      ['echo out; echo err >&2; exit 7', {}],
      ['kill -9 $$', {}],
      ['head -c 300000 /dev/zero | tr "\\0" x', {}],
    ];
    for (const [command, extra] of cases) {
      const native = await way(true, () => exec(command, extra));
      expect(native, command).toEqual(await way(false, () => exec(command, extra)));
    }
    expect((await way(true, () => exec('cat; echo done', { stdin: 'some input\n' }))).stdout).toBe('some input\ndone\n');
    expect((await way(true, () => exec('kill -9 $$'))).exitCode).toBe(137);
    expect((await way(true, () => exec('head -c 300000 /dev/zero | tr "\\0" x'))).stdout).toHaveLength(300_000);
  });

  it('answers once the command exits, even while a background job holds its output open', async () => {
    const started = performance.now();
    const out = await way(true, () => exec('sleep 5 & echo started'));
    expect(out).toMatchObject({ exitCode: 0, stdout: 'started\n' });
    expect(performance.now() - started).toBeLessThan(2_000);
  });

  it('enters for a helper the same way both ways, with the capabilities asked for', async () => {
    const probe = ['/bin/sh', '-c', 'grep CapBnd /proc/self/status; pwd; readlink /proc/self/ns/mnt; sort /proc/self/cgroup'];
    for (const guestCaps of [true, false]) {
      const at = { ...entry, workdir: '/', guestCaps };
      const native = await way(true, () => run(enterArgv(at, probe)));
      expect(native).toEqual(await way(false, () => run(enterArgv(at, probe))));
      expect(native.code).toBe(0);
      expect(native.out.includes('a00425fb')).toBe(guestCaps);
    }
    // The program's exit code and signal come back as the chain's nsenter passes them on.
    const at = { ...entry, workdir: '/' };
    expect((await way(true, () => run(enterArgv(at, ['/bin/sh', '-c', 'exit 5'])))).code).toBe(5);
    expect((await way(true, () => run(enterArgv(at, ['/bin/sh', '-c', 'kill -TERM $$'])))).code).toBeNull();
  });

  it('runs nothing when a cgroup cannot be joined, with the shell join line and code', async () => {
    const marker = `/tmp/ran-${newId('process')}`;
    for (const mode of ['--enter', '--exec']) {
      const got = await run([helper!, [mode, String(entry.initPid), '/', 'all', '1', join(base, 'no-such-group'), '--', '/bin/touch', marker]]);
      expect(got).toEqual({ code: 97, out: '', err: `${JOIN_FAILED} ${join(base, 'no-such-group')}\n` });
    }
    expect((await way(true, () => exec(`test -e ${marker} && echo ran || echo not-run`))).stdout).toBe('not-run\n');
  });

  it('fails as a stopped desktop when the guest init is gone', async () => {
    const gone = 4_194_303; // above any pid_max this kernel allows by default
    const got = await run([helper!, ['--enter', String(gone), '/', 'all', '0', '--', '/bin/true']]);
    expect(got.code).toBe(1);
    expect(got.err.startsWith(ENTER_FAILED)).toBe(true);
    expect(await failure(way(true, () => exec('true', { initPid: gone })))).toMatchObject({ code: 'not_running' });
  });

  it('starts no warm exec server where a cold exec is as quick: execs run cold, files still get theirs', async (ctx) => {
    // The driver turned favordynmods on at its start, where the host has a cgroup2 mount to remount.
    if ((await favorDynamicCgroups(true, () => undefined)) === 'unavailable') ctx.skip();
    expect(coldExecIsQuick()).toBe(true);
    const titles = async () => {
      const pids = (await readFile(`/sys/fs/cgroup/pids/canto/${id}/cgroup.procs`, 'utf8')).split('\n').filter(Boolean);
      return Promise.all(pids.map(async (pid) => (await readFile(`/proc/${pid}/comm`, 'utf8').catch(() => '')).trim()));
    };
    for (let i = 0; i < 3; i++) {
      // The shell's parent is the native relay, outside the guest's pid namespace: no parent there.
      expect((await driver.exec(id, { command: 'echo $PPID', timeoutMs: 10_000, maxOutputBytes: 1024 })).stdout).toBe('0\n');
    }
    await driver.statPath(id, '/root');
    await until(async () => (await titles()).some((t) => t.startsWith('canto-helper')));
    await driver.statPath(id, '/root');
    expect(await titles()).not.toContain('canto-exec');
  });

  it("reports a working directory the guest lacks as the command's failure, not as a stopped desktop", async () => {
    const at = { ...entry, workdir: '/no/such/dir' };
    const native = await way(true, () => run(execArgv(at, ['/bin/sh', '-c', 'true'])));
    expect(native.code).toBe(1);
    expect(native.err).toMatch(/cannot change directory to \/no\/such\/dir/);
    expect(native.err.startsWith(ENTER_FAILED)).toBe(false);
    expect((await way(false, () => run(execArgv(at, ['/bin/sh', '-c', 'true'])))).code).toBe(1);
  });

  it('leaves what it starts dumpable: a job started natively after a restore survives the next hibernate and wake', async (ctx) => {
    if (!driver.capabilities().memorySnapshots) ctx.skip();
    expect(await driver.hibernate(id), logged.join('\n')).toEqual({ snapshot: true });
    expect(await driver.start({ desktopId: id, tier: 'small', firstBoot: null }), logged.join('\n')).toEqual({ restored: true });
    const init = JSON.parse(await readFile(join(base, 'state', 'desktops', id, 'run', 'init.json'), 'utf8')) as { pid: number };
    entry = { ...entry, initPid: init.pid };
    // A restored desktop runs in a time namespace of its own: a job outside it would make the next dump unrestorable.
    expect((await way(true, () => exec('setsid sleep 1000 >/dev/null 2>&1 < /dev/null & echo $!'))).exitCode).toBe(0);
    expect(await driver.hibernate(id), logged.join('\n')).toEqual({ snapshot: true });
    expect(await driver.start({ desktopId: id, tier: 'small', firstBoot: null }), logged.join('\n')).toEqual({ restored: true });
    expect((await driver.exec(id, { command: 'pgrep -x sleep', timeoutMs: 10_000, maxOutputBytes: 1024 })).exitCode).toBe(0);
  });
});
