/**
 * The sandbox runtime driver against the real machine: bubblewrap namespaces, Xvfb, cgroup v1 and
 * CRIU. Needs root; CRIU-specific cases are skipped when the driver reports no memory snapshots.
 * Every desktop created here is destroyed in afterAll, and timings are printed for the docs.
 */
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createHash } from 'node:crypto';
import { promisify } from 'node:util';
import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import { AgentFailure } from '../../shared/src/protocol.js';
import { TIER_SPECS } from '../../shared/src/tiers.js';
import { createSandboxDriver, type SandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { hostnameFor } from '../../agent/src/runtime/sandbox/guest/guest-init.js';
import { isAlive, isRoot, stopwatch } from '../helpers/sandbox.js';
import { until } from '../helpers/wait.js';
import { coldExecIsQuick } from '../../agent/src/runtime/sandbox/guest/guest-entry.js';

const execFileAsync = promisify(execFile);
if (!isRoot) console.warn('sandbox-driver tests skipped: they need root (namespaces, cgroups, CRIU)');
const { timings, timed } = stopwatch();

describe.skipIf(!isRoot)('sandbox driver', () => {
  let base: string;
  let stateDir: string;
  let driver: SandboxDriver;
  const logged: string[] = [];
  const created: Array<{ driver: () => SandboxDriver; id: string }> = [];
  function track(id: string, d: () => SandboxDriver = () => driver): string {
    created.push({ driver: d, id });
    return id;
  }

  async function sh(d: SandboxDriver, id: string, command: string): Promise<string> {
    const out = await d.exec(id, { command, timeoutMs: 10_000, maxOutputBytes: 65536 });
    expect(out.stderr, `stderr of ${command}`).toBe('');
    expect(out.exitCode, `exit code of ${command}`).toBe(0);
    return out.stdout.trim();
  }

  async function bootCold(tier: 'small' | 'default' = 'small'): Promise<string> {
    const id = track(newId('desktop'));
    await driver.prepare(id, tier);
    const result = await timed('cold boot (start)', () => driver.start({ desktopId: id, tier, firstBoot: null }));
    expect(result.restored).toBe(false);
    return id;
  }

  beforeAll(async () => {
    base = await mkdtemp(join(tmpdir(), 'canto-sandbox-test-'));
    stateDir = join(base, 'state');
    // What the driver logs, for the failure messages: a dump that fell back to a cold stop says why only there.
    driver = await createSandboxDriver({ stateDir, log: (msg, fields) => logged.push(`${msg} ${JSON.stringify(fields ?? {})}`) });
  });

  afterAll(async () => {
    for (const { driver: d, id } of created) await d().destroy(id);
    await driver?.close();
    if (base) await rm(base, { recursive: true, force: true });
    console.log('sandbox driver timings (ms):', JSON.stringify(timings));
  });

  it('boots cold into its own namespaces with a 1024x768 display', async () => {
    const id = await bootCold();
    // Cold commands, or (where cold is slower: guest-entry.ts) warm ones after the first: /root either way.
    expect(await sh(driver, id, 'pwd')).toBe('/root');
    expect(await sh(driver, id, 'echo hello')).toBe('hello');
    expect(await sh(driver, id, 'id -u')).toBe('0');
    // A cold command's parent is outside the guest ($PPID 0, which ps refuses); a warm one's is the server.
    const parent = () => sh(driver, id, 'ps -o comm= -p $PPID 2>/dev/null || true');
    await until(async () => (await parent()) === (coldExecIsQuick() ? '' : 'canto-exec'), 10_000, 'an exec');
    expect(await sh(driver, id, 'pwd')).toBe('/root');
    const guestHost = await sh(driver, id, 'hostname');
    expect(guestHost).toBe(id.replace('_', '-'));
    expect(guestHost).not.toBe(hostname());
    // Only the guest's processes: a handful of small pids, no vitest (node) in sight.
    const pids = (await sh(driver, id, 'ls /proc | grep -E "^[0-9]+$"')).split('\n').map(Number);
    expect(pids).toContain(1);
    expect(pids.length).toBeLessThan(20);
    expect(pids.every((p) => p < 1000)).toBe(true);
    expect(await sh(driver, id, 'ps -e -o comm=')).not.toMatch(/node|vitest/);
    // Booted, pid 1 only reaps orphans, and `ps` shows it as the one line that does, not the boot script.
    expect(await sh(driver, id, 'ps -o args= -p 1')).toBe('/bin/sh -c echo ready >&4; exec 4>&-; while :; do sleep 2147483647 & wait $!; done canto-init');
    await sh(driver, id, 'setsid sh -c "sleep 0.2 & exit 0"');
    await until(async () => (await sh(driver, id, 'ps -e -o stat=,args= | grep -e "^Z" -e " sleep 0.2$" || true')) === '', 5_000, 'the orphan to be reaped');
    expect(await sh(driver, id, 'xdotool getdisplaygeometry')).toBe('1024 768');
    expect(await sh(driver, id, 'xrandr --current | head -1')).toContain('maximum 2560 x 1600');
    expect(await sh(driver, id, 'echo $DISPLAY $HOME')).toBe(':0 /root');
    expect(await sh(driver, id, 'ip -o link | wc -l')).toBe('1'); // loopback only
    // /dev/shm: open to everyone with the sticky bit, inside /dev's tmpfs (not a mount of its own).
    expect(await sh(driver, id, 'stat -c %a /dev/shm')).toBe('1777');
    expect(await sh(driver, id, "awk '$5 == \"/dev/shm\"' /proc/self/mountinfo")).toBe('');
    expect(await sh(driver, id, 'setpriv --reuid=65534 --regid=65534 --clear-groups sh -c "echo shared > /dev/shm/nobody" && cat /dev/shm/nobody')).toBe('shared');
    await timed('exec (echo)', () => driver.exec(id, { command: 'true', timeoutMs: 5_000, maxOutputBytes: 65536 }));
    expect(driver.capabilities().runtime).toBe('sandbox');
  });

  it('applies the tier limits through cgroups', async () => {
    const id = await bootCold('default');
    const spec = TIER_SPECS.default;
    const cg = (ctrl: string, file: string) => readFile(`/sys/fs/cgroup/${ctrl}/canto/${id}/${file}`, 'utf8');
    expect(Number(await cg('memory', 'memory.limit_in_bytes'))).toBe(spec.memoryMb * 1024 * 1024);
    expect(Number(await cg('pids', 'pids.max'))).toBe(spec.maxPids);
    const period = Number(await cg('cpu', 'cpu.cfs_period_us'));
    expect(Number(await cg('cpu', 'cpu.cfs_quota_us'))).toBe(spec.vcpus * period);
    // Both the guest init and exec'd commands are inside the groups.
    const procs = (await cg('pids', 'cgroup.procs')).split('\n').filter(Boolean);
    expect(procs.length).toBeGreaterThan(3);
    expect(await sh(driver, id, 'grep pids /proc/self/cgroup')).toContain(`/canto/${id}`);
  });

  it('does not expose host files beyond the read-only /usr and /etc', async () => {
    const id = await bootCold();
    const secretPath = join(base, 'host-secret.txt');
    await writeFile(secretPath, 'TOP-SECRET-HOST-FILE');
    const attempts = [
      `cat ${secretPath}`,
      `cat /proc/1/root${secretPath}`,
      `cat /proc/*/root${secretPath}`,
      `ln -sf /proc/1/root /root/escape && cat /root/escape${secretPath}`,
      `ln -sf ${secretPath} /tmp/link && cat /tmp/link`,
      `cat ${join(stateDir, 'desktops', id, 'run', 'init.json')}`,
    ];
    for (const command of attempts) {
      const out = await driver.exec(id, { command, timeoutMs: 5_000, maxOutputBytes: 65536 });
      expect(out.exitCode, command).not.toBe(0);
      expect(out.stdout, command).not.toContain('TOP-SECRET');
    }
    // Read-only binds stay read-only even for the guest's root (no CAP_SYS_ADMIN).
    for (const command of ['touch /usr/canto-probe', 'touch /etc/canto-probe', 'touch /canto-probe', 'mount -o remount,rw /usr', 'touch /etc/ssl/private/canto-probe']) {
      const out = await driver.exec(id, { command, timeoutMs: 5_000, maxOutputBytes: 65536 });
      expect(out.exitCode, command).not.toBe(0);
    }
    expect(existsSync('/usr/canto-probe')).toBe(false);
    // The masked directory is a read-only view of an empty directory of the desktop's.
    expect(await readdir(join(stateDir, 'desktops', id, 'empty'))).toEqual([]);
    // The host's password hashes are masked inside the shared /etc.
    const shadow = await driver.exec(id, { command: 'cat /etc/shadow /etc/gshadow', timeoutMs: 5_000, maxOutputBytes: 65536 });
    expect(shadow.stdout).not.toContain('root:');
    const keys = await driver.exec(id, { command: 'ls -A /etc/ssl/private', timeoutMs: 5_000, maxOutputBytes: 65536 });
    expect(keys.stdout).toBe('');
  });

  it('applies first boot once: env file and setup script', async () => {
    const id = track(newId('desktop'));
    const value = `it's "quoted" $HOME \\ end`;
    const firstBoot = {
      env: { GREETING: value, EMPTY: '' },
      setupScript: 'echo ran >> /root/setup-runs; echo "greeting=$GREETING"; echo oops >&2; exit 3',
    };
    await driver.prepare(id, 'small');
    await driver.start({ desktopId: id, tier: 'small', firstBoot });
    expect(await sh(driver, id, 'stat -c %a /root/.canto/env')).toBe('600');
    expect(await sh(driver, id, '. /root/.canto/env && printf %s "$GREETING"')).toBe(value);
    const procDir = '/root/.canto/processes/setup';
    await until(async () => (await driver.exec(id, { command: `test -f ${procDir}/exit_code`, timeoutMs: 5_000, maxOutputBytes: 65536 })).exitCode === 0);
    expect(await sh(driver, id, `cat ${procDir}/exit_code`)).toBe('3');
    expect(await sh(driver, id, `cat ${procDir}/stdout`)).toBe(`greeting=${value}`);
    expect(await sh(driver, id, `cat ${procDir}/stderr`)).toBe('oops');
    // Repeated start (running) and a stop/start with the same spec do not re-run it.
    await driver.start({ desktopId: id, tier: 'small', firstBoot });
    await driver.hibernate(id);
    await driver.start({ desktopId: id, tier: 'small', firstBoot });
    expect(await sh(driver, id, 'cat /root/setup-runs')).toBe('ran');
  });

  it('writes an env file larger than a pipe holds at boot, and one pending on a running desktop through exec', async () => {
    // Rendered, every quote becomes four characters: well past the 64 KiB a pipe buffers.
    const big = `'${"x'".repeat(30_000)}`;
    const id = track(newId('desktop'));
    await driver.prepare(id, 'small');
    await driver.start({ desktopId: id, tier: 'small', firstBoot: { env: { BIG: big }, setupScript: null } });
    // One exec: the file holds the value whole, and no temporary file is left beside it.
    expect(await sh(driver, id, '. /root/.canto/env && printf %s "$BIG" | sha256sum && ls -A /root/.canto')).toBe(
      `${createHash('sha256').update(big).digest('hex')}  -\nenv`,
    );

    // Started without a first boot (an agent that crashed before it), then asked again while
    // running: no boot to carry the file, so it is written through exec.
    const late = track(newId('desktop'));
    await driver.prepare(late, 'small');
    await driver.start({ desktopId: late, tier: 'small', firstBoot: null });
    expect(await sh(driver, late, 'test -e /root/.canto/env || echo none')).toBe('none');
    await driver.start({ desktopId: late, tier: 'small', firstBoot: { env: { LATE: 'yes' }, setupScript: null } });
    expect(await sh(driver, late, '. /root/.canto/env && printf %s "$LATE"')).toBe('yes');
  });

  it('fails a first boot whose env file cannot be written, saying so', async () => {
    const id = track(newId('desktop'));
    await driver.prepare(id, 'small');
    // A file where the env file's directory goes: the init's mkdir fails.
    await writeFile(join(stateDir, 'desktops', id, 'disk', 'root', '.canto'), 'in the way');
    const err = await driver.start({ desktopId: id, tier: 'small', firstBoot: { env: { A: 'b' }, setupScript: null } }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AgentFailure);
    expect((err as AgentFailure).message).toContain('writing the env file failed');
  });

  it('exec reports timeouts, unknown and stopped desktops, and bad ids', async () => {
    const id = await bootCold();
    const started = Date.now();
    const err = await driver.exec(id, { command: 'sleep 30; echo never', timeoutMs: 300, maxOutputBytes: 65536 }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AgentFailure);
    expect((err as AgentFailure).code).toBe('timeout');
    expect(Date.now() - started).toBeLessThan(5_000);
    expect(await sh(driver, id, 'ps -eo args= | grep -c "^sleep 30$" || true')).toBe('0');
    const exit = await driver.exec(id, { command: 'echo out; echo err >&2; exit 7', timeoutMs: 5_000, maxOutputBytes: 65536 });
    expect(exit).toEqual({ exitCode: 7, stdout: 'out\n', stderr: 'err\n', stdoutTruncated: false, stderrTruncated: false });

    const unknown = await driver.exec(newId('desktop'), { command: 'true', timeoutMs: 1_000, maxOutputBytes: 65536 }).catch((e: unknown) => e);
    expect((unknown as AgentFailure).code).toBe('not_found');
    const bad = await driver.exec('dsk_../../etc', { command: 'true', timeoutMs: 1_000, maxOutputBytes: 65536 }).catch((e: unknown) => e);
    expect((bad as AgentFailure).code).toBe('bad_request');
    await expect(driver.prepare('../x', 'small')).rejects.toMatchObject({ code: 'bad_request' });

    const stopped = track(newId('desktop'));
    await driver.prepare(stopped, 'small');
    const notRunning = await driver.exec(stopped, { command: 'true', timeoutMs: 1_000, maxOutputBytes: 65536 }).catch((e: unknown) => e);
    expect((notRunning as AgentFailure).code).toBe('not_running');
    expect(await driver.hibernate(stopped)).toEqual({ snapshot: false });
  });

  it('hibernates with a memory snapshot and wakes with processes still running, twice (one started between)', async (ctx) => {
    if (!driver.capabilities().memorySnapshots) ctx.skip();
    const id = await bootCold();
    await sh(driver, id, 'echo persisted > /root/hello.txt');
    const sleepPid = await sh(driver, id, 'sleep 1000 >/dev/null 2>&1 & echo $!');
    await sh(driver, id, `nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /root/counter; sleep 0.02; done' >/dev/null 2>&1 &`);
    const counter = async () => Number(await sh(driver, id, 'cat /root/counter 2>/dev/null || echo 0'));
    await until(async () => (await counter()) > 0);
    // A server on loopback: its listening socket can only be restored once 127.0.0.1 is back.
    await sh(driver, id, `perl -MIO::Socket::INET -e '$s = IO::Socket::INET->new(LocalAddr => "127.0.0.1:7007", Listen => 5) or die; while ($c = $s->accept) { print $c "pong\\n"; close $c }' >/dev/null 2>&1 &`);
    const ping = 'perl -MIO::Socket::INET -e \'$c = IO::Socket::INET->new("127.0.0.1:7007") or die "connect: $!"; print scalar <$c>\'';
    await until(async () => (await driver.exec(id, { command: ping, timeoutMs: 5_000, maxOutputBytes: 100 })).stdout === 'pong\n');
    // The root's per-mount options as a cold boot leaves them (read-only, and the rest): a restore
    // makes the root read-only again and must change nothing else.
    const rootOptions = "awk '$5 == \"/\" { print $6 }' /proc/self/mountinfo";
    const bootedRoot = await sh(driver, id, rootOptions);
    expect(bootedRoot.split(',')).toContain('ro');

    // Started after the first restore: it must be restored by the second one too.
    let between: string | null = null;
    for (let round = 1; round <= 2; round++) {
      const before = await counter();
      const hib = await timed('hibernate (CRIU dump)', () => driver.hibernate(id));
      expect(hib, logged.filter((line) => line.includes(id)).join('\n')).toEqual({ snapshot: true });
      // The network namespace is dumped without its contents (criu.ts): no links, addresses,
      // routes or firewall tables, which restores make anew.
      const images = await readdir(join(stateDir, 'desktops', id, 'snapshot'));
      expect(images).toContain('pstree.img');
      expect(images.filter((f) => /^(netdev|ifaddr|route6?|rule|ip6?tables|nftables)-/.test(f))).toEqual([]);
      expect(await driver.list()).toContainEqual({ desktopId: id, running: false, hasSnapshot: true });
      // Nothing of the desktop runs, and its cgroups are gone.
      expect(existsSync(`/sys/fs/cgroup/pids/canto/${id}`)).toBe(false);
      expect(await driver.hibernate(id)).toEqual({ snapshot: true }); // idempotent

      const restores = driver.restores();
      const woke = await timed('wake (CRIU restore)', () => driver.start({ desktopId: id, tier: 'small', firstBoot: null }));
      expect(woke).toEqual({ restored: true });
      // Counted for the agent's metrics (canto_agent_restores_total).
      expect(driver.restores()).toEqual({ restored: restores.restored + 1, failed: restores.failed });
      expect(await driver.list()).toContainEqual({ desktopId: id, running: true, hasSnapshot: false });
      expect(await sh(driver, id, 'cat /root/hello.txt')).toBe('persisted');
      expect(await sh(driver, id, `ps -o comm= -p ${sleepPid}`)).toBe('sleep');
      expect(await sh(driver, id, 'ps -o args= -p 1')).toMatch(/^\/bin\/sh -c echo ready .* canto-init$/);
      if (between !== null) expect(await sh(driver, id, `ps -o args= -p ${between}`)).toBe('sleep 2000');
      await until(async () => (await counter()) > before + 2);
      expect(await sh(driver, id, 'xdotool getdisplaygeometry')).toBe('1024 768');
      expect(await sh(driver, id, ping)).toBe('pong');
      expect(await sh(driver, id, 'ip -o addr show dev lo | grep -c -e "inet 127.0.0.1/8" -e "inet6 ::1/128"')).toBe('2');
      expect(await sh(driver, id, 'touch /canto-probe 2>&1 || echo read-only')).toContain('read-only');
      expect(await sh(driver, id, rootOptions)).toBe(bootedRoot);
      expect(await sh(driver, id, 'hostname')).toBe(hostnameFor(id));
      expect(await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).toEqual({ restored: false });
      between ??= await sh(driver, id, 'sleep 2000 >/dev/null 2>&1 & echo $!');
    }
  });

  it('falls back to a cold boot when a snapshot cannot be restored', async (ctx) => {
    if (!driver.capabilities().memorySnapshots) ctx.skip();
    const id = await bootCold();
    await sh(driver, id, 'echo survives > /root/hello.txt');
    expect(await driver.hibernate(id)).toEqual({ snapshot: true });
    await rm(join(stateDir, 'desktops', id, 'snapshot', 'pstree.img'));
    const restores = driver.restores();
    expect(await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).toEqual({ restored: false });
    expect(driver.restores()).toEqual({ restored: restores.restored, failed: restores.failed + 1 });
    expect(await sh(driver, id, 'cat /root/hello.txt')).toBe('survives');
    expect(await driver.list()).toContainEqual({ desktopId: id, running: true, hasSnapshot: false });
    expect(Number(await readFile(`/sys/fs/cgroup/pids/canto/${id}/pids.max`, 'utf8'))).toBe(TIER_SPECS.small.maxPids);
  });

  it('boots cold instead when a restored desktop does not answer', async (ctx) => {
    if (!driver.capabilities().memorySnapshots) ctx.skip();
    const id = await bootCold();
    await sh(driver, id, 'echo survives > /root/hello.txt');
    // X gone before the dump: the restore succeeds, but nothing takes an X client afterwards.
    await sh(driver, id, 'pkill -x Xvfb; while pgrep -x Xvfb >/dev/null; do sleep 0.01; done');
    const init = JSON.parse(await readFile(join(stateDir, 'desktops', id, 'run', 'init.json'), 'utf8')) as { pid: number };
    expect(await driver.hibernate(id)).toEqual({ snapshot: true });
    const restores = driver.restores();
    expect(await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).toEqual({ restored: false });
    expect(driver.restores()).toEqual({ restored: restores.restored, failed: restores.failed + 1 });
    // The restored copy is gone and a fresh boot runs, with the disk and a working display.
    const now = JSON.parse(await readFile(join(stateDir, 'desktops', id, 'run', 'init.json'), 'utf8')) as { pid: number };
    expect(now.pid).not.toBe(init.pid);
    expect(await sh(driver, id, 'cat /root/hello.txt')).toBe('survives');
    expect(await sh(driver, id, 'xdotool getdisplaygeometry')).toBe('1024 768');
    expect((await readdir(join(stateDir, 'desktops', id))).some((f) => f.startsWith('snapshot.failed-'))).toBe(true);
    // The restored copy was stopped before the cold boot.
    const restoredPid = Number(await readFile(join(stateDir, 'desktops', id, 'run', 'restore.pid'), 'utf8'));
    expect(restoredPid).toBeGreaterThan(0);
    expect(existsSync(`/proc/${restoredPid}`)).toBe(false);
  });

  it('a new driver on the same state directory adopts running desktops', async () => {
    const id = await bootCold();
    await sh(driver, id, 'echo adopted > /root/mark');
    const second = await createSandboxDriver({ stateDir });
    try {
      expect(await second.list()).toContainEqual({ desktopId: id, running: true, hasSnapshot: false });
      expect(await sh(second, id, 'cat /root/mark')).toBe('adopted');
      expect(await second.start({ desktopId: id, tier: 'small', firstBoot: null })).toEqual({ restored: false });
    } finally {
      await second.close();
    }
  });

  it('desktops keep running after the agent process that started them exits', async () => {
    const id = track(newId('desktop'));
    const script = join(base, 'agent-child.mts');
    const driverModule = new URL('../../agent/src/runtime/sandbox/index.ts', import.meta.url).pathname;
    await writeFile(
      script,
      `import { createSandboxDriver } from ${JSON.stringify(driverModule)};
const d = await createSandboxDriver({ stateDir: ${JSON.stringify(stateDir)} });
const spec = { desktopId: ${JSON.stringify(id)}, tier: 'small', firstBoot: null };
await d.start(spec);
await d.exec(spec.desktopId, { command: 'sleep 1002 >/dev/null 2>&1 &', timeoutMs: 5000, maxOutputBytes: 65536 });
if (d.capabilities().memorySnapshots) { await d.hibernate(spec.desktopId); await d.start(spec); }
await d.close();
`,
    );
    const tsx = new URL('../../node_modules/.bin/tsx', import.meta.url).pathname;
    await execFileAsync(tsx, [script], { timeout: 30_000 });
    expect(await driver.list()).toContainEqual({ desktopId: id, running: true, hasSnapshot: false });
    expect(await sh(driver, id, 'ps -eo args= | grep -c "^sleep 1002$" || true')).toBe('1');
    expect(await sh(driver, id, 'xdotool getdisplaygeometry')).toBe('1024 768');
  });

  it('cold-stop mode keeps the disk but not the processes, and boots at 1024x768 again (SPEC: a cold boot reverts the size)', async () => {
    const cold = await createSandboxDriver({ stateDir: join(base, 'state-cold'), memorySnapshots: false });
    try {
      expect(cold.capabilities()).toEqual({ runtime: 'sandbox', memorySnapshots: false, computerUse: true });
      const id = track(newId('desktop'), () => cold);
      await cold.start({ desktopId: id, tier: 'small', firstBoot: null });
      await sh(cold, id, 'echo kept > /root/hello.txt; sleep 1001 >/dev/null 2>&1 &');
      expect(await cold.setDisplay(id, { width: 1280, height: 800 })).toEqual({ width: 1280, height: 800 });
      expect(await sh(cold, id, 'ps -eo args= | grep -c "^sleep 1001$" || true')).toBe('1');
      // What heartbeats report: this driver's running desktops, and the machine's desktop memory.
      const usage = await cold.usage();
      expect(usage.running).toBe(1);
      expect(usage.memoryBytes).toBeGreaterThanOrEqual(Number(await readFile(`/sys/fs/cgroup/memory/canto/${id}/memory.usage_in_bytes`, 'utf8')));
      const hib = await timed('hibernate (cold stop)', () => cold.hibernate(id));
      expect(hib).toEqual({ snapshot: false });
      expect((await cold.usage()).running).toBe(0);
      expect(await cold.list()).toEqual([{ desktopId: id, running: false, hasSnapshot: false }]);
      expect(await cold.start({ desktopId: id, tier: 'small', firstBoot: null })).toEqual({ restored: false });
      expect(await sh(cold, id, 'cat /root/hello.txt')).toBe('kept');
      expect(await sh(cold, id, 'ps -eo args= | grep -c "^sleep 1001$" || true')).toBe('0');
      expect(await sh(cold, id, 'xdotool getdisplaygeometry')).toBe('1024 768');
    } finally {
      await cold.close();
    }
  });

  it('destroy removes disk, snapshot and cgroups, and is idempotent', async () => {
    const id = await bootCold();
    if (driver.capabilities().memorySnapshots) {
      expect(await driver.hibernate(id)).toEqual({ snapshot: true });
    }
    await driver.destroy(id);
    expect(existsSync(join(stateDir, 'desktops', id))).toBe(false);
    await until(async () => (await readdir(join(stateDir, 'discarded'))).length === 0, 10_000, 'its files, set aside, to be removed behind the answer');
    for (const ctrl of ['memory', 'cpu', 'pids']) {
      expect(existsSync(`/sys/fs/cgroup/${ctrl}/canto/${id}`)).toBe(false);
    }
    expect((await driver.list()).map((d) => d.desktopId)).not.toContain(id);
    await driver.destroy(id);
    await driver.destroy(newId('desktop'));
    // And a running desktop: its processes are gone afterwards.
    const running = await bootCold();
    const init = JSON.parse(await readFile(join(stateDir, 'desktops', running, 'run', 'init.json'), 'utf8')) as { pid: number };
    await driver.destroy(running);
    expect(await isAlive(init.pid)).toBe(false);
  });
});
