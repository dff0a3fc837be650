/**
 * What confines every guest beyond its namespaces, on the real runtime; needs root.
 *
 * Keyrings (guest/guest-filter.ts): guests are root without a user namespace, and the kernel
 * keeps keyrings per uid, so without the seccomp filter a key one desktop adds is read by every
 * other desktop and by the host's root. Every way into a guest runs under the filter: the guest
 * init and what it starts (bwrap), a cold exec and a file helper (the spawner's native entry), the
 * chain of programs without it (nsenter, then guest-filter.pl), and a restored guest (CRIU keeps
 * the filter).
 *
 * /proc/sys (host/proc-seal.ts): uid 0 writes a sysctl by its file mode alone, so a guest could
 * set `kernel.core_pattern` and have the host's root run a file of its disk. It is read-only in a
 * guest booted cold, by either way of sealing it, and after a restore.
 *
 * A memory snapshot whose guest ran without either (host/confinement.ts) boots cold.
 */
import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import type { Readable, Writable } from 'node:stream';
import { readFile, rm, mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import { GUEST_FILTER, GUEST_FILTER_ID, guestFilterArgv } from '../../agent/src/runtime/sandbox/guest/guest-filter.js';
import { guestFile } from '../../agent/src/runtime/sandbox/guest/guest-programs.js';
import { maskedProcFiles } from '../../agent/src/runtime/sandbox/guest/guest-init.js';
import { detectCriu } from '../../agent/src/runtime/sandbox/host/criu.js';
import { helperPath } from '../../agent/src/runtime/sandbox/host/spawner.js';
import { SEALED_PROC_PATHS, sealProcSys, untilBlockedOn } from '../../agent/src/runtime/sandbox/host/proc-seal.js';
import { missingConfinement } from '../../agent/src/runtime/sandbox/host/confinement.js';
import { existsSync, readFileSync } from 'node:fs';
import { createSandboxDriver, type SandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { destroyLeftDesktops, isRoot } from '../helpers/sandbox.js';

const criu = isRoot && process.arch === 'x64' ? await detectCriu(undefined) : null;

/** Perl that adds (`add`) or looks for (`find`) a key in root's user keyring: what it got, or the errno. */
function keyProbe(what: 'add' | 'find', name: string): string {
  const call = what === 'add' ? 'syscall(248, $t, $d, $p, length($p), -4)' : 'syscall(250, 10, -4, $t, $d, 0)';
  return `my ($t, $d, $p) = ("user", "${name}", "secret"); my $r = ${call}; print $r < 0 ? "errno " . ($! + 0) . "\\n" : "key\\n";`;
}
const EPERM = 'errno 1\n';
const ENOKEY = 'errno 126\n';

/** The probe on the host, as root: what a guest without the filter would see. */
function onHost(what: 'add' | 'find', name: string, through: string[] = []): string {
  return execFileSync(through[0] ?? 'perl', [...through.slice(1), ...(through.length > 0 ? ['perl'] : []), '-e', keyProbe(what, name)], { encoding: 'utf8' });
}

/**
 * bwrap as the cold boot runs it, reduced to what matters: `script` waits, its namespaces and
 * mounts made, on fd 4 (written to go on); answers the child and the pid of the guest's init.
 */
async function blockedBwrap(script: string): Promise<{ child: ChildProcess; pid: number }> {
  const child = spawn('bwrap', [
    '--unshare-pid', '--ro-bind', '/usr', '/usr', '--symlink', 'usr/lib', '/lib', '--symlink', 'usr/lib64', '/lib64', '--symlink', 'usr/bin', '/bin',
    '--dev', '/dev', '--proc', '/proc', '--cap-drop', 'ALL', '--cap-add', 'CAP_DAC_OVERRIDE', '--as-pid-1', '--info-fd', '3', '--block-fd', '4',
    '/bin/sh', '-c', script,
  ], { stdio: ['ignore', 'pipe', 'ignore', 'pipe', 'pipe'] });
  for (const stream of child.stdio) stream?.on('error', () => undefined);
  let text = '';
  for await (const chunk of child.stdio[3] as Readable) {
    text += String(chunk);
    if (/"child-pid":\s*\d+[\s\S]*}/.test(text)) break;
  }
  const pid = Number(/"child-pid":\s*(\d+)/.exec(text)![1]);
  await untilBlockedOn(pid, 4, 'dsk_probe');
  return { child, pid };
}

describe.skipIf(criu === null)('guest confinement', () => {
  let base: string;
  let driver: SandboxDriver;
  const name = `canto-test-${newId('desktop')}`;

  beforeAll(async () => {
    base = await mkdtemp(join(tmpdir(), 'canto-keyrings-'));
    driver = await createSandboxDriver({ stateDir: join(base, 'state'), goldenTemplates: false });
  });

  afterAll(async () => {
    // A guest that got through (the filter broken) left its key in root's keyring: unlinked.
    if (onHost('find', name) !== ENOKEY) execFileSync('perl', ['-e', `my ($t, $d) = ("user", "${name}"); syscall(250, 9, syscall(250, 10, -4, $t, $d, 0), -4);`]);
    await driver?.close();
    await destroyLeftDesktops(join(base, 'state'));
    await rm(base, { recursive: true, force: true });
  });

  const run = async (id: string, command: string) => (await driver.exec(id, { command, timeoutMs: 10_000, maxOutputBytes: 65536 })).stdout;
  const initStatus = (id: string) => run(id, 'grep ^Seccomp: /proc/1/status');
  /** Writes a sysctl its own value (harmless where it goes through): what happened. */
  const procSysWrite = (id: string) =>
    run(id, 'f=/proc/sys/fs/inotify/max_user_watches; v=$(cat $f); if (echo "$v" > $f) 2>/dev/null; then echo written; else echo refused; fi');
  /** The sealed paths this kernel has, with the first mount flag the guest sees at each (`ro` when sealed). */
  const expectedSealed = SEALED_PROC_PATHS.filter((p) => existsSync(p)).map((p) => [p, 'ro']);
  const sealedPaths = async (id: string) => {
    const mounts = (await run(id, 'cat /proc/self/mountinfo')).split('\n').map((line) => line.split(' '));
    return SEALED_PROC_PATHS.filter((p) => existsSync(p)).map((p) => [p, mounts.filter((f) => f[4] === p).at(-1)?.[5]?.split(',')[0] ?? 'none']);
  };
  const initPid = (id: string) => (JSON.parse(readFileSync(join(base, 'state', 'desktops', id, 'run', 'init.json'), 'utf8')) as { pid: number }).pid;
  /** The bytes each masked /proc file this kernel has reads in the guest, one line each. */
  const maskedBytes = (id: string) => run(id, `for f in ${maskedProcFiles().join(' ')}; do printf '%s %s\\n' "$f" "$(cat "$f" 2>/dev/null | wc -c)"; done`);
  const expectedMasked = maskedProcFiles().map((f) => `${f} 0\n`).join('');
  const probe = async (id: string, what: 'add' | 'find') =>
    (await driver.exec(id, { command: `perl -e '${keyProbe(what, name)}'`, timeoutMs: 10_000, maxOutputBytes: 1000 })).stdout;

  it('the spawner and this module hold the same filter', () => {
    const helper = helperPath();
    expect(helper, 'the spawner is built (npm run build)').not.toBeNull();
    expect(execFileSync(helper!, ['--guest-filter'])).toEqual(GUEST_FILTER);
  });

  it('the chain of programs installs it before the program it names', () => {
    expect(onHost('find', name, guestFilterArgv())).toBe(EPERM);
    // Without it, root on the host reaches the keyring every guest would share.
    expect(onHost('find', name)).toBe(ENOKEY);
  });

  it('seals /proc/sys through nsenter where the spawner binary is not used', async () => {
    const { child, pid } = await blockedBwrap('f=/proc/sys/fs/inotify/max_user_watches; if (echo "$(cat $f)" > $f) 2>/dev/null; then echo written; else echo refused; fi');
    await sealProcSys(pid, '/usr/bin/nsenter', 'dsk_probe', null);
    (child.stdio[4] as Writable).end('go');
    let out = '';
    for await (const chunk of child.stdout!) out += String(chunk);
    expect(out).toBe('refused\n');
  }, 30_000);

  it('fails a seal that leaves a path writable (a spawner binary of an older build)', async () => {
    const { child, pid } = await blockedBwrap('true');
    try {
      // A binary that answers 0 and seals nothing.
      await expect(sealProcSys(pid, '/usr/bin/nsenter', 'dsk_probe', '/bin/true')).rejects.toThrow(/still writable after the seal: \/proc\/sys/);
      // The real one seals only paths of /proc, whatever it is asked.
      expect(spawnSync(helperPath()!, ['--seal-proc', String(pid), '/etc'], { encoding: 'utf8' })).toMatchObject({ status: 2, stderr: expect.stringContaining('paths of /proc only') as unknown });
      // What a restored guest is checked for, on a process confined by nothing.
      expect(await missingConfinement(pid)).toEqual(expect.arrayContaining(['a seccomp filter', 'a read-only /proc/sys']));
    } finally {
      child.kill('SIGKILL');
    }
  }, 30_000);

  it('has the guest init stop when bwrap started it unsealed (its block fd closed unwritten)', async () => {
    const child = spawn('bwrap', [
      '--unshare-pid', '--ro-bind', '/usr', '/usr', '--symlink', 'usr/lib', '/lib', '--symlink', 'usr/lib64', '/lib64', '--symlink', 'usr/bin', '/bin',
      '--ro-bind', '/etc', '/etc', '--dev', '/dev', '--proc', '/proc', '--cap-drop', 'ALL', '--cap-add', 'CAP_DAC_OVERRIDE', '--as-pid-1',
      '/bin/sh', '-c', guestFile('init.sh'), 'canto-init', '800x600', '800x600', '/tmp', '-', ...SEALED_PROC_PATHS,
    ], { stdio: ['ignore', 'ignore', 'ignore', 'ignore', 'pipe'] });
    for (const stream of child.stdio) stream?.on('error', () => undefined);
    // Were it to go on, it would wait for an Xvfb that never comes: bounded.
    const bound = setTimeout(() => child.kill('SIGKILL'), 10_000);
    const exited = once(child, 'exit');
    let said = '';
    for await (const chunk of child.stdio[4] as Readable) said += String(chunk);
    const [code] = (await exited) as [number];
    clearTimeout(bound);
    expect(said).toMatch(/^writable:( \/proc\/[a-z_]+)+\n$/);
    expect(said).toContain(' /proc/sys');
    expect(code).toBe(1);
  });

  it('seals the /proc of a guest that was running before the agent started, booted without the seal', async () => {
    const id = newId('desktop');
    await driver.prepare(id, 'small');
    await driver.start({ desktopId: id, tier: 'small', firstBoot: null });
    // As an agent before the seal left it: the binds undone from outside.
    const init = JSON.parse(await readFile(join(base, 'state', 'desktops', id, 'run', 'init.json'), 'utf8')) as { pid: number };
    execFileSync('nsenter', ['-t', String(init.pid), '-m', '-r', '--', '/bin/sh', '-c', 'umount /proc/sys']);
    expect(await procSysWrite(id)).toBe('written\n');
    // The agent starts again; the guest runs on.
    await driver.close();
    driver = await createSandboxDriver({ stateDir: join(base, 'state'), goldenTemplates: false });
    expect(await procSysWrite(id)).toBe('refused\n');
    await driver.destroy(id);
  });

  it('keeps every guest, cold or restored, out of the keyrings and the host\'s sysctls', async () => {
    const a = newId('desktop');
    const b = newId('desktop');
    for (const id of [a, b]) {
      await driver.prepare(id, 'small');
      await driver.start({ desktopId: id, tier: 'small', firstBoot: null });
    }
    expect(await initStatus(a)).toBe('Seccomp:\t2\n');
    expect(await procSysWrite(a)).toBe('refused\n');
    expect(await missingConfinement(initPid(a))).toEqual([]);
    // The rest of /proc that acts on the whole host is read-only too (mount flags: never written here).
    expect(await sealedPaths(a)).toEqual(expectedSealed);
    // What of /proc names every task and key of the host reads empty.
    expect(await maskedBytes(a)).toBe(expectedMasked);
    expect(await probe(a, 'add')).toBe(EPERM);
    expect(await probe(b, 'find')).toBe(EPERM);
    // The chain of programs, where the spawner's entry is off.
    process.env.CANTO_AGENT_NATIVE_ENTRY = 'off';
    try {
      expect(await probe(b, 'add')).toBe(EPERM);
    } finally {
      delete process.env.CANTO_AGENT_NATIVE_ENTRY;
    }
    // Nothing reached root's keyring either.
    expect(onHost('find', name)).toBe(ENOKEY);

    expect(await driver.hibernate(a)).toEqual({ snapshot: true });
    expect((await driver.start({ desktopId: a, tier: 'small', firstBoot: null })).restored).toBe(true);
    expect(await initStatus(a)).toBe('Seccomp:\t2\n');
    expect(await probe(a, 'add')).toBe(EPERM);
    expect(await procSysWrite(a)).toBe('refused\n');
    expect(await maskedBytes(a)).toBe(expectedMasked);

    // An image whose init ran without a filter (a guest booted before it existed, whose entrants
    // since carry it), or with a writable /proc/sys, is not restored: it boots cold, confined.
    const snapshot = join(base, 'state', 'desktops', a, 'snapshot');
    const record = join(snapshot, 'confinement.json');
    const sealedHere = SEALED_PROC_PATHS.filter((p) => existsSync(p));
    for (const without of [{ seccomp_filter: null }, { proc_read_only: sealedHere.filter((p) => p !== '/proc/sys') }, { proc_read_only: sealedHere.slice(0, -1) }]) {
      expect(await driver.hibernate(a)).toEqual({ snapshot: true });
      expect(JSON.parse(await readFile(record, 'utf8'))).toEqual({ seccomp_filter: GUEST_FILTER_ID, proc_read_only: sealedHere });
      await writeFile(record, JSON.stringify({ seccomp_filter: GUEST_FILTER_ID, proc_read_only: sealedHere, ...without }));
      expect((await driver.start({ desktopId: a, tier: 'small', firstBoot: null })).restored, JSON.stringify(without)).toBe(false);
      expect(await initStatus(a)).toBe('Seccomp:\t2\n');
      expect(await procSysWrite(a)).toBe('refused\n');
    }

    // Nor is one whose guest ran under another filter (or none).
    expect(await driver.hibernate(a)).toEqual({ snapshot: true });
    const images = join(snapshot, 'seccomp.img');
    const bytes = await readFile(images);
    // Every copy (a warm server entered on its own holds one beside the init's).
    let copies = 0;
    for (let at = bytes.indexOf(GUEST_FILTER); at >= 0; at = bytes.indexOf(GUEST_FILTER, at + 1), copies++) {
      // The errno the filter answers (the k of its next-to-last instruction): EPERM becomes ENOENT.
      const errno = at + GUEST_FILTER.length - 2 * 8 + 4;
      bytes.writeUInt8(bytes.readUInt8(errno) ^ 0x02, errno);
    }
    expect(copies).toBeGreaterThan(0);
    await writeFile(images, bytes);
    expect((await driver.start({ desktopId: a, tier: 'small', firstBoot: null })).restored).toBe(false);
    expect(await initStatus(a)).toBe('Seccomp:\t2\n');
    expect(await probe(a, 'add')).toBe(EPERM);
    for (const id of [a, b]) await driver.destroy(id);
  }, 120_000);
});
