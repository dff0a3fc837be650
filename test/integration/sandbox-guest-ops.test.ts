/**
 * Guest operations of the sandbox driver against the real machine: detached processes and exec
 * limits inside a real desktop, and what hibernate and a move's stop do to them. Needs root. One
 * desktop is shared by the whole file (the hibernate case runs last; see
 * test/helpers/sandbox-guest-world.ts); file operations are in sandbox-guest-files.test.ts.
 */
import { describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import { until } from '../helpers/scheduler.js';
import { failure } from '../helpers/agent-failure.js';
import { isRoot } from '../helpers/sandbox.js';
import { driver, hostPidsWithArgs, id, put, sh, text, timed, useGuestDesktop } from '../helpers/sandbox-guest-world.js';

if (!isRoot) console.warn('sandbox guest-ops tests skipped: they need root (namespaces, cgroups, CRIU)');

describe.skipIf(!isRoot)('sandbox driver guest operations', () => {
  useGuestDesktop();

  it('runs detached processes with the env file and reports status and tails', async () => {
    // The first boot's setup script runs detached: the start answers once it is started.
    await until(async () => (await driver.processStatus(id, 'setup', 100))?.status === 'exited', 10_000, 'the setup script to end');
    expect(await driver.processStatus(id, 'setup', 100)).toEqual({
      status: 'exited', exitCode: 4, stdoutTail: 'setup-out\n', stderrTail: 'setup-err\n',
    });
    const a = newId('process');
    await timed('spawn', () =>
      driver.spawnDetached(id, { processId: a, command: 'printf "%s\\n" "$GREETING"; echo err >&2; sleep 0.4; exit 5' }),
    );
    expect((await driver.processStatus(id, a, 100))?.status).toBe('running');
    expect(await sh(`cat /root/.canto/processes/${a}/pid`)).toMatch(/^\d+ \d+$/);
    await until(async () => (await driver.processStatus(id, a, 100))?.status === 'exited');
    expect(await timed('process status', () => driver.processStatus(id, a, 100))).toEqual({
      status: 'exited', exitCode: 5, stdoutTail: `hello 'world'\n`, stderrTail: 'err\n',
    });

    const b = newId('process');
    await driver.spawnDetached(id, { processId: b, command: 'seq 1 1000; echo run >> /root/b-runs' });
    await until(async () => (await driver.processStatus(id, b, 10))?.status === 'exited');
    const full = Array.from({ length: 1000 }, (_, i) => `${i + 1}\n`).join('');
    expect((await driver.processStatus(id, b, 10))?.stdoutTail).toBe(full.slice(-10));
    expect((await driver.processStatus(id, b, 0))?.stdoutTail).toBe('');
    expect((await driver.processStatus(id, b, 1 << 20))?.stdoutTail).toBe(full);
    // A repeated spawn (a re-sent command) does not start the process again.
    await driver.spawnDetached(id, { processId: b, command: 'echo run >> /root/b-runs' });
    expect(await sh('cat /root/b-runs')).toBe('run');

    // Killed from inside the guest: lost, not exited. A pid with another start time is not it.
    const c = newId('process');
    await driver.spawnDetached(id, { processId: c, command: 'sleep 1000' });
    const [pid] = (await sh(`cat /root/.canto/processes/${c}/pid`)).split(' ');
    await sh(`kill -9 -${pid}`);
    await until(async () => (await driver.processStatus(id, c, 10))?.status === 'lost');
    await sh(`echo "1 42" > /root/.canto/processes/${c}/pid`);
    expect((await driver.processStatus(id, c, 10))?.status).toBe('lost');

    // A restored memory snapshot gives every process a new start time: the runner of the
    // process's own directory is still it; another process at the recorded pid is not.
    const d = newId('process');
    await driver.spawnDetached(id, { processId: d, command: 'sleep 1000' });
    const [runner] = (await sh(`cat /root/.canto/processes/${d}/pid`)).split(' ');
    await sh(`echo "${runner} 42" > /root/.canto/processes/${d}/pid`);
    expect((await driver.processStatus(id, d, 10))?.status).toBe('running');
    const sleeper = await sh('sleep 1000 >/dev/null 2>&1 & echo $!');
    await sh(`echo "${sleeper} 42" > /root/.canto/processes/${d}/pid`);
    expect((await driver.processStatus(id, d, 10))?.status, `pid ${sleeper} is a sleep, not the runner`).toBe('lost');
    await sh(`kill ${sleeper}; kill -9 -${runner}`);

    expect(await driver.processStatus(id, newId('process'), 10)).toBeNull();
    for (const bad of ['prc_x', '../setup', `prc_${'A'.repeat(24)}`, 'setup2', '']) {
      expect((await failure(driver.processStatus(id, bad, 10))).code, bad).toBe('bad_request');
      expect((await failure(driver.spawnDetached(id, { processId: bad, command: 'true' }))).code, bad).toBe('bad_request');
    }
  });

  it('exec applies the env file and limits its output', async () => {
    expect(await sh('printf %s "$GREETING"')).toBe(`hello 'world'`);
    const cut = await driver.exec(id, { command: 'head -c 5000 /dev/zero | tr "\\0" a; echo e >&2', timeoutMs: 5_000, maxOutputBytes: 1000 });
    expect(cut).toEqual({ exitCode: 0, stdout: 'a'.repeat(1000), stderr: 'e\n', stdoutTruncated: true, stderrTruncated: false });
    const exact = await driver.exec(id, { command: 'head -c 1000 /dev/zero', timeoutMs: 5_000, maxOutputBytes: 1000 });
    expect([exact.stdout.length, exact.stdoutTruncated]).toEqual([1000, false]);
    // SIGPIPE has its default action in commands, as in a terminal.
    expect(await driver.exec(id, { command: 'yes | head -1', timeoutMs: 5_000, maxOutputBytes: 100 })).toMatchObject({
      exitCode: 0, stdout: 'y\n', stderr: '',
    });
    for (let i = 0; i < 20; i++) await timed('exec true', () => driver.exec(id, { command: 'true', timeoutMs: 5_000, maxOutputBytes: 100 }));
  });

  it('hibernate fences guest operations and kills detached processes but not background jobs', async () => {
    const snapshots = driver.capabilities().memorySnapshots;
    const detached = newId('process');
    await driver.spawnDetached(id, { processId: detached, command: 'sleep 1003' });
    await sh('sleep 1001 >/dev/null 2>&1 &');
    await put('/root/h/slow.txt', 'old');
    await put('/root/h/stuck.txt', 'old');

    // One upload finishes within the grace, one never does and is killed.
    const slow = driver.writeFile(id, { path: '/root/h/slow.txt', appendAt: null }, (async function* () {
      for (let i = 0; i < 5; i++) {
        yield Buffer.from(`part ${i};`);
        await new Promise((r) => setTimeout(r, 60));
      }
    })());
    let unstick: () => void = () => undefined;
    const stuck = driver.writeFile(id, { path: '/root/h/stuck.txt', appendAt: null }, (async function* () {
      yield Buffer.from('never complete');
      await new Promise<void>((r) => (unstick = r));
    })());
    const exec = driver.exec(id, { command: 'sleep 30', timeoutMs: 60_000, maxOutputBytes: 100 });
    await until(async () => (await hostPidsWithArgs('write', '/root/h/stuck.txt')).length > 0);

    const t0 = Date.now();
    const hibernating = driver.hibernate(id);
    expect((await failure(driver.statPath(id, '/root'))).code).toBe('not_running');
    expect((await failure(driver.exec(id, { command: 'true', timeoutMs: 1_000, maxOutputBytes: 10 }))).code).toBe('not_running');
    expect((await failure(exec)).code).toBe('not_running');
    await slow;
    expect((await failure(stuck)).code).toBe('not_running');
    unstick();
    expect(await hibernating).toEqual({ snapshot: snapshots });
    expect(Date.now() - t0).toBeLessThan(15_000);
    expect((await failure(driver.statPath(id, '/root'))).code).toBe('not_running');

    expect(await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).toEqual({ restored: snapshots });
    expect(await text('/root/h/slow.txt')).toBe('part 0;part 1;part 2;part 3;part 4;');
    expect(await text('/root/h/stuck.txt')).toBe('old');
    expect(await sh('ls -A /root/h')).toBe('slow.txt\nstuck.txt');
    expect((await driver.processStatus(id, detached, 10))?.status).toBe('lost');
    expect(await sh('ps -eo args= | grep -c "^sleep 1003$" || true')).toBe('0');
    if (snapshots) expect(await sh('ps -eo args= | grep -c "^sleep 1001$" || true')).toBe('1');
    expect((await driver.processStatus(id, 'setup', 100))?.status).toBe('exited');
  });

  it("a move's stop keeps detached processes in the memory snapshot: running after the restore", async (ctx) => {
    if (!driver.capabilities().memorySnapshots) ctx.skip(); // A cold stop ends them either way.
    const kept = newId('process');
    await driver.spawnDetached(id, { processId: kept, command: 'while :; do date +%s%N >> /root/kept.log; sleep 0.05; done' });
    await until(async () => (await sh('cat /root/kept.log 2>/dev/null | wc -l')) !== '0');
    expect(await driver.hibernate(id, { keepDetached: true })).toEqual({ snapshot: true });
    expect(await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).toEqual({ restored: true });
    expect((await driver.processStatus(id, kept, 10))?.status).toBe('running');
    const lines = Number(await sh('wc -l < /root/kept.log'));
    await until(async () => Number(await sh('wc -l < /root/kept.log')) > lines);
  });
});
