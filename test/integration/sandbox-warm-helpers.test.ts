/**
 * Warm guest servers of the sandbox driver against the real machine: they live in the guest's
 * namespaces and cgroups, give the same results as cold helpers, are replaced when something kills
 * them, never outlive the guest init they belong to (hibernate, wake, cold stop), and are gone
 * after `close()`. Needs root. Warm servers are found from the host as members of the desktop's
 * pids cgroup titled `canto-helper` (files) or `canto-exec` (exec).
 *
 * The file runs with the chain of programs as the way into the guest (CANTO_AGENT_NATIVE_ENTRY=off):
 * a host that enters natively starts no exec server (guest-entry.ts; sandbox-guest-entry.test.ts).
 */
import { execFile } from 'node:child_process';
import { mkdtemp, readdir, readFile, readlink, rm } from 'node:fs/promises';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import { guestHelperProgram, warmHelperProgram } from '../../agent/src/runtime/sandbox/guest/guest-helper.js';
import { execServerProgram, warmPrologue } from '../../agent/src/runtime/sandbox/guest/warm-perl.js';
import { createSandboxDriver, type SandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { failure } from '../helpers/agent-failure.js';
import { hostProcesses, isAlive, isRoot, parentPid } from '../helpers/sandbox.js';
import { until } from '../helpers/wait.js';

const execFileAsync = promisify(execFile);

if (!isRoot) console.warn('sandbox warm-server tests skipped: they need root (namespaces, cgroups, CRIU)');

const MiB = 1024 * 1024;

interface WarmProc {
  readonly pid: number;
  /** The process title: `canto-helper…` or `canto-exec`. */
  readonly comm: string;
  /** True for a server itself (its parent is what entered the guest), false for its children. */
  readonly server: boolean;
}

/** What a server's parent is: the native entry (guest-entry.ts) or, without it, nsenter. */
const ENTERED_BY = new Set(['canto-spawn', 'nsenter']);

async function comm(pid: number): Promise<string> {
  return (await readFile(`/proc/${pid}/comm`, 'utf8').catch(() => '')).trim();
}

/** Warm processes of a desktop, by kind. */
async function warmProcs(desktopId: string): Promise<{ file: WarmProc[]; exec: WarmProc[] }> {
  const text = await readFile(`/sys/fs/cgroup/pids/canto/${desktopId}/cgroup.procs`, 'utf8').catch(() => '');
  const out: { file: WarmProc[]; exec: WarmProc[] } = { file: [], exec: [] };
  for (const pid of text.split('\n').filter(Boolean).map(Number)) {
    if (!(await isAlive(pid))) continue;
    const title = await comm(pid);
    const kind = title.startsWith('canto-helper') ? 'file' : title === 'canto-exec' ? 'exec' : null;
    if (kind === null) continue;
    out[kind].push({ pid, comm: title, server: ENTERED_BY.has(await comm(await parentPid(pid))) });
  }
  return out;
}


async function initOf(stateDir: string, desktopId: string): Promise<number> {
  return (JSON.parse(await readFile(join(stateDir, 'desktops', desktopId, 'run', 'init.json'), 'utf8')) as { pid: number }).pid;
}

describe.skipIf(!isRoot)('sandbox driver warm guest servers', () => {
  let base: string;
  let stateDir: string;
  let driver: SandboxDriver;
  let id: string;

  async function sh(command: string, d: SandboxDriver = driver, desktopId = id): Promise<string> {
    const out = await d.exec(desktopId, { command, timeoutMs: 10_000, maxOutputBytes: MiB });
    expect(out.stderr, `stderr of ${command}`).toBe('');
    expect(out.exitCode, `exit code of ${command}`).toBe(0);
    return out.stdout.trim();
  }

  /**
   * Runs operations until both servers of the desktop are up with their children waiting and an
   * exec ran on one; the file server, started at the same moment, is given a moment more.
   */
  async function warmUp(d: SandboxDriver = driver, desktopId = id): Promise<{ file: WarmProc[]; exec: WarmProc[] }> {
    let procs = await warmProcs(desktopId);
    await until(async () => {
      await d.statPath(desktopId, '/root');
      if (!(await execRanWarm(d, desktopId))) return false;
      procs = await warmProcs(desktopId);
      return procs.file.length >= 3 && procs.exec.length >= 3;
    });
    await new Promise((r) => setTimeout(r, 200));
    return warmProcs(desktopId);
  }

  /** True when this exec ran on a child of the warm exec server (whose title is its parent's). */
  async function execRanWarm(d: SandboxDriver = driver, desktopId = id): Promise<boolean> {
    return (await sh('cat /proc/$PPID/comm 2>/dev/null || echo none', d, desktopId)) === 'canto-exec';
  }

  const nativeEntry = process.env.CANTO_AGENT_NATIVE_ENTRY;

  beforeAll(async () => {
    process.env.CANTO_AGENT_NATIVE_ENTRY = 'off';
    base = await mkdtemp(join(tmpdir(), 'canto-warm-test-'));
    stateDir = join(base, 'state');
    driver = await createSandboxDriver({ stateDir });
    id = newId('desktop');
    await driver.prepare(id, 'small');
    await driver.start({ desktopId: id, tier: 'small', firstBoot: { env: { GREETING: 'warm hello' }, setupScript: null } });
  });

  afterAll(async () => {
    if (id) await driver?.destroy(id);
    await driver?.close();
    if (base) await rm(base, { recursive: true, force: true });
    if (nativeEntry === undefined) delete process.env.CANTO_AGENT_NATIVE_ENTRY;
    else process.env.CANTO_AGENT_NATIVE_ENTRY = nativeEntry;
  });

  it('the warm programs compile under strict', async () => {
    const programs = {
      prologue: warmPrologue(),
      files: warmHelperProgram(),
      exec: execServerProgram('exec /bin/sh -c "$0"', 4, 2),
    };
    for (const [name, program] of Object.entries(programs)) {
      const { stderr } = await execFileAsync('perl', ['-Mstrict', '-w', '-c', '-e', program]);
      expect(stderr.trim(), name).toBe('-e syntax OK');
    }
    // A warm file helper has every operation but the one that starts guest code.
    expect(warmHelperProgram()).not.toContain(`$op eq 'spawn'`);
    expect(warmHelperProgram()).toContain(`$op eq 'kill-detached'`);
    expect(guestHelperProgram('spawn')).toContain('cannot start /bin/sh');
  });

  it('runs its servers inside the guest, and serves operations from them', async () => {
    const procs = await warmUp();
    const init = await initOf(stateDir, id);
    for (const ns of ['pid', 'mnt', 'net', 'uts', 'ipc']) {
      const guest = await readlink(`/proc/${init}/ns/${ns}`);
      for (const p of [...procs.file, ...procs.exec]) expect(await readlink(`/proc/${p.pid}/ns/${ns}`), `${ns} of ${p.pid}`).toBe(guest);
    }
    expect(procs.file.filter((p) => p.server)).toHaveLength(1);
    expect(procs.exec.filter((p) => p.server)).toHaveLength(1);

    // Exec: a session of its own inside the guest, the env file, the guest's capabilities.
    expect(await execRanWarm()).toBe(true);
    expect(await sh('printf %s "$GREETING"')).toBe('warm hello');
    // The same working directory as a cold exec.
    expect(await sh('pwd')).toBe('/root');
    expect(await sh('[ "$(cut -d" " -f6 /proc/$$/stat)" = "$$" ] && echo leader')).toBe('leader');
    const fresh = await createSandboxDriver({ stateDir });
    try {
      // A new driver's first exec runs cold.
      expect(await execRanWarm(fresh)).toBe(false);
      expect(await sh('grep CapBnd /proc/self/status')).toBe(await sh('grep CapBnd /proc/self/status', fresh));
    } finally {
      await fresh.close();
    }
    expect(await driver.exec(id, { command: 'echo out; echo err >&2; exit 7', timeoutMs: 5_000, maxOutputBytes: 100 })).toEqual({
      exitCode: 7, stdout: 'out\n', stderr: 'err\n', stdoutTruncated: false, stderrTruncated: false,
    });
    const cut = await driver.exec(id, { command: 'head -c 300000 /dev/zero | tr "\\0" a', timeoutMs: 5_000, maxOutputBytes: 1000 });
    expect([cut.stdout, cut.stdoutTruncated]).toEqual(['a'.repeat(1000), true]);
    expect((await driver.exec(id, { command: 'kill -9 $$', timeoutMs: 5_000, maxOutputBytes: 100 })).exitCode).toBe(137);
    // A background job holding the pipes does not hold the exec.
    const t0 = Date.now();
    expect(await sh('sleep 1009 & echo started')).toBe('started');
    expect(Date.now() - t0).toBeLessThan(2_000);
    // A timeout kills the command's whole session and what it started, in a session of its own too.
    const command = 'setsid sleep 1010 & sleep 1005 & sleep 1006';
    const err = await failure(driver.exec(id, { command, timeoutMs: 300, maxOutputBytes: 100 }));
    expect(err.code).toBe('timeout');
    expect(await sh('ps -eo args= | grep -cE "^sleep 10(05|06|10)$" || true')).toBe('0');

    // Files: a child of the server does the upload, titled with what it does.
    // The gate exists before the body is pulled: the child takes its title before the agent asks
    // for the second piece, and a resume that came first must not be lost.
    let resume: () => void = () => undefined;
    const gate = new Promise<void>((r) => (resume = r));
    const upload = driver.writeFile(id, { path: '/root/warm.txt', appendAt: null }, (async function* () {
      yield Buffer.from('one ');
      await gate;
      yield Buffer.from('two');
    })());
    await until(async () => (await warmProcs(id)).file.some((p) => p.comm.startsWith('canto-helper wr')));
    resume();
    await upload;
    const read = await driver.readFile(id, { path: '/root/warm.txt', offset: null, length: 0, maxWholeBytes: MiB });
    const parts: Buffer[] = [];
    for await (const part of read.body) parts.push(part);
    expect(Buffer.concat(parts).toString()).toBe('one two');
    expect((await failure(driver.statPath(id, '/root/missing'))).code).toBe('path_missing');
  });

  it('answers nobody but the agent on its socket', async () => {
    await warmUp();
    const run = join(stateDir, 'desktops', id, 'run');
    const sock = (await readdir(run)).find((n) => n.startsWith('warm-file-'));
    expect(sock).toBeDefined();
    // A connection without the server's token gets nothing and is closed.
    const got = await new Promise<string>((resolve, reject) => {
      const s = connect(join(run, sock as string));
      let data = '';
      s.on('data', (d: Buffer) => (data += d.toString()));
      s.on('close', () => resolve(data));
      // The server hangs up on what it did not read: a reset, not an error of the test.
      s.on('error', (e: NodeJS.ErrnoException) => (e.code === 'ECONNRESET' ? undefined : reject(e)));
      s.write(`${'0'.repeat(32)}\n00000009\nstat\0/root`);
    });
    expect(got).toBe('');
    // Other host users cannot connect at all.
    const nobody = await execFileAsync('setpriv', [
      '--reuid=65534', '--regid=65534', '--clear-groups', 'perl', '-e',
      `socket(my $s, 1, 1, 0) or die; print connect($s, pack('S a108', 1, $ARGV[0])) ? 'connected' : 'refused'`,
      join(run, sock as string),
    ]);
    expect(nobody.stdout).toBe('refused');
  });

  it("serves an operation with the guest's capabilities only, in a helper the guest can neither trace nor look into", async () => {
    await warmUp();
    // An operation that keeps its helper for a while: input that only waits.
    const waiting = driver.input(id, [{ type: 'wait', ms: 6_000 }]);
    const probe = [
      'pid=; for p in /proc/[0-9]*; do case "$(tr "\\0" " " < $p/cmdline 2>/dev/null)" in "canto-helper xinput"*) pid=${p#/proc/};; esac; done',
      '[ -n "$pid" ] || exit 0',
      'grep -E "^(CapEff|CapPrm|CapBnd):" /proc/$pid/status',
      // What the agent opens of a helper (guest-handoff.ts): one of its descriptors, through /proc.
      'readlink /proc/$pid/fd/0 >/dev/null 2>&1 && echo descriptor followed || echo descriptor refused',
      // PTRACE_ATTACH (16) through the raw system call (`+ 0`: a string would go as a pointer);
      // detached at once should it be let through.
      `perl -MConfig -e 'my $ptrace = $Config{archname} =~ /aarch64/ ? 117 : 101; my $p = $ARGV[0] + 0; if (syscall($ptrace, 16, $p, 0, 0) == 0) { print "attached\\n"; syscall($ptrace, 17, $p, 0, 0) } else { print "attach refused: $!\\n" }' $pid`,
    ].join('\n');
    // Until the helper has dropped what it may: a probe can come between its start and the drop.
    let seen = '';
    await until(async () => (seen = await sh(probe)).includes('CapEff:\t00000000a00425fb'), 5_000, 'the helper serving the input').catch(() => undefined);
    expect(seen.split('\n')).toEqual([
      'CapPrm:\t00000000a00425fb',
      'CapEff:\t00000000a00425fb',
      'CapBnd:\t00000000a00425fb',
      'descriptor refused',
      'attach refused: Operation not permitted',
    ]);
    expect(await waiting).toEqual(expect.objectContaining({ x: expect.any(Number) }));
  });

  it('replaces children the guest kills, and a server killed from the host', async () => {
    await warmUp();
    // From inside the guest: every waiting child (not the servers, whose parent is outside, and
    // not the child running this very command).
    await sh(`ps -eo pid=,ppid=,comm= | awk '$2 != 0 && ($3 == "canto-exec" || $3 == "canto-helper") && $1 != '"$PPID"' { print $1 }' | xargs -r kill -9`);
    // The servers fork replacements as the killed ones are reaped; on a loaded machine that takes
    // a moment, during which operations run cold.
    await warmUp();
    for (let i = 0; i < 5; i++) {
      expect(await execRanWarm()).toBe(true);
      expect((await driver.statPath(id, '/root')).fileType).toBe('directory');
    }
    // From the host: the servers themselves. Operations go on (cold), and new servers come up.
    const before = await warmProcs(id);
    for (const p of [...before.file, ...before.exec]) if (p.server) process.kill(p.pid, 'SIGKILL');
    await until(async () => {
      const now = await warmProcs(id);
      return [...now.file, ...now.exec].every((p) => !before.file.concat(before.exec).some((b) => b.pid === p.pid));
    });
    expect((await driver.statPath(id, '/root')).fileType).toBe('directory');
    expect(await sh('echo still')).toBe('still');
    const after = await warmUp();
    expect(after.file.some((p) => before.file.some((b) => b.pid === p.pid))).toBe(false);
    expect(await execRanWarm()).toBe(true);
  });

  it('replaces a server that stops serving (its processes stopped)', async () => {
    const before = await warmUp();
    for (const p of before.file) process.kill(p.pid, 'SIGSTOP');
    // The connection is not taken: after a bound the operation runs cold, and the server goes.
    const t0 = Date.now();
    expect((await driver.statPath(id, '/root')).fileType).toBe('directory');
    expect(Date.now() - t0).toBeLessThan(10_000);
    await until(async () => {
      for (const p of before.file) if (await isAlive(p.pid)) return false;
      return true;
    });
    const after = await warmUp();
    expect(after.file.some((p) => before.file.some((b) => b.pid === p.pid))).toBe(false);
  });

  it('lets a replaced server finish the operation it is serving, then retires it', async () => {
    await warmUp();
    let release: () => void = () => undefined;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const writing = driver.writeFile(id, { path: '/root/drain.txt', appendAt: null }, (async function* () {
      yield Buffer.from('first ');
      await gate;
      yield Buffer.from('second');
    })());
    const busy = await until(async () => {
      const found = await hostProcesses((args) => args[0]?.startsWith('canto-helper write /root/drain.txt') === true);
      return found[0];
    }, 10_000, 'the writing child');
    // The server and its idle children (the one forked after the write took its child included)
    // stop answering; the busy child goes on.
    const others = (await warmProcs(id)).file.filter((p) => p.pid !== busy.pid);
    for (const p of others) process.kill(p.pid, 'SIGSTOP');
    expect((await driver.statPath(id, '/root')).fileType).toBe('directory');
    expect(await isAlive(busy.pid)).toBe(true);
    release();
    await writing;
    expect(await sh('cat /root/drain.txt')).toBe('first second');
    // A kill of stopped processes may take its every step (warm-server.ts `kill`: up to 11 s in
    // all), as it did once in a loaded full run: waited for as long.
    await until(async () => {
      for (const p of others) if (await isAlive(p.pid)) return false;
      return true;
    }, 15_000, 'the replaced server and its idle children to be gone');
  }, 30_000);

  it('kills the servers before a hibernate and never reuses them after the wake', async () => {
    const snapshots = driver.capabilities().memorySnapshots;
    const before = await warmUp();
    await sh('echo restored-guest > /run/marker; sleep 1008 >/dev/null 2>&1 &');
    expect(await driver.hibernate(id)).toEqual({ snapshot: snapshots });
    for (const p of [...before.file, ...before.exec]) expect(await isAlive(p.pid), `pid ${p.pid} (${p.comm}${p.server ? ', a server' : ''})`).toBe(false);

    expect(await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).toEqual({ restored: snapshots });
    // At once, before any server of the new guest is ready.
    expect((await driver.statPath(id, '/root')).fileType).toBe('directory');
    expect(await sh('cat /run/marker 2>/dev/null || echo fresh')).toBe(snapshots ? 'restored-guest' : 'fresh');
    if (snapshots) expect(await sh('ps -eo args= | grep -c "^sleep 1008$" || true')).toBe('1');
    const after = await warmUp();
    const init = await initOf(stateDir, id);
    for (const p of [...after.file, ...after.exec]) {
      expect(await readlink(`/proc/${p.pid}/ns/pid`)).toBe(await readlink(`/proc/${init}/ns/pid`));
      expect(before.file.concat(before.exec).some((b) => b.pid === p.pid)).toBe(false);
    }
    expect(await execRanWarm()).toBe(true);
    expect(await sh('cat /run/marker 2>/dev/null || echo fresh')).toBe(snapshots ? 'restored-guest' : 'fresh');
  });

  it('drops the servers across a cold stop and a cold boot', async () => {
    const cold = await createSandboxDriver({ stateDir: join(base, 'state-cold'), memorySnapshots: false });
    const other = newId('desktop');
    try {
      await cold.start({ desktopId: other, tier: 'small', firstBoot: null });
      const before = await warmUp(cold, other);
      await sh('echo old-guest > /run/marker', cold, other);
      expect(await cold.hibernate(other)).toEqual({ snapshot: false });
      for (const p of [...before.file, ...before.exec]) expect(await isAlive(p.pid)).toBe(false);
      expect(await cold.start({ desktopId: other, tier: 'small', firstBoot: null })).toEqual({ restored: false });
      expect(await sh('cat /run/marker 2>/dev/null || echo fresh', cold, other)).toBe('fresh');
      await warmUp(cold, other);
      expect(await execRanWarm(cold, other)).toBe(true);
      expect(await sh('cat /run/marker 2>/dev/null || echo fresh', cold, other)).toBe('fresh');
    } finally {
      await cold.destroy(other);
      await cold.close();
    }
    expect(await warmProcs(other)).toEqual({ file: [], exec: [] });
  });

  it("starts a moved desktop's servers at its first start, before any call", async () => {
    const moved = newId('desktop');
    await driver.prepare(moved, 'small');
    try {
      // What the command table asks for the first start of a desktop imported here.
      await driver.start({ desktopId: moved, tier: 'small', firstBoot: null, inUse: true });
      await until(async () => {
        const procs = await warmProcs(moved);
        return procs.file.some((p) => p.server) && procs.exec.some((p) => p.server);
      }, 10_000, 'both warm servers, with no call made');
      expect(await execRanWarm(driver, moved)).toBe(true);
    } finally {
      await driver.destroy(moved);
    }
  });

  it('close() kills the servers, and a new driver on the same state works', async () => {
    const before = await warmUp();
    await driver.close();
    // Killed: the servers are reaped before close() answers; their children get their SIGKILL
    // as the servers exit (PR_SET_PDEATHSIG) and, on a loaded machine, act on it a moment later.
    const alive = async () => (await Promise.all([...before.file, ...before.exec].map((p) => isAlive(p.pid)))).some(Boolean);
    await until(async () => !(await alive()), 5_000, 'the warm servers and their children to be gone');
    expect(await warmProcs(id)).toEqual({ file: [], exec: [] });
    expect((await readdir(join(stateDir, 'desktops', id, 'run'))).filter((n) => n.startsWith('warm-'))).toEqual([]);

    driver = await createSandboxDriver({ stateDir });
    expect((await driver.statPath(id, '/root')).fileType).toBe('directory');
    expect(await sh('echo after close')).toBe('after close');
    await warmUp();
    expect(await execRanWarm()).toBe(true);
  });
});
