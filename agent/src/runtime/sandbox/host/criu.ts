/**
 * Memory snapshots with CRIU 4.x.
 *
 * Dump: `criu dump -t <guest init>` kills the tree after writing the images. Every bind mount of
 * the guest is passed as `--external mnt[<guest path>]:<key>`; the keys (stored beside the images
 * in externals.json) are derived from guest paths only, so images carry no host paths.
 *
 * Restore: into fresh namespaces (never in place), with `--root` pointing at the empty skeleton
 * and each key mapped to the desktop's host directory. CRIU reparents the restored tree to its own
 * parent when it detaches, so the restore runs under a small keeper process that marks itself a
 * child subreaper (prctl PR_SET_CHILD_SUBREAPER), reports CRIU's exit code on stdout, then stays
 * as the reaper of the restored init — detached from the agent, so desktops outlive it. The keeper
 * is the process spawner's keeper mode (agent/native/canto-spawn.c) where that is built, else a
 * Perl program (Perl is always present on Debian and can call prctl directly).
 */
import { spawn } from 'node:child_process';
import { access, constants, lstat, mkdir, mkdtemp, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { delimiter, dirname, join } from 'node:path';
import type { Readable } from 'node:stream';
import { execa } from 'execa';
import { cgroupDirs, joinArgv } from './cgroups.js';
import { ensureKdatCache, KDAT_FILE } from './criu-kdat.js';
import { procStat, waitFor } from './host-procs.js';
import { helperPath, runToEnd, spawnProcess } from './spawner.js';
import { ensureSkeletonRun, exists, GUEST_FB_DIR, type DesktopPaths } from './layout.js';
import { bindMounts, GUEST_CAPS_ONLY, hostnameFor, hostPathForGuestMount, maskedHostPaths, maskedProcFiles } from '../guest/guest-init.js';
import { etcHiddenFor } from './etc-view.js';
import { guestFile, perlProgram } from '../guest/guest-programs.js';
import { recordConfinement, requireConfinement } from './confinement.js';
import { runningInit, type InitProcess } from './cold-boot.js';
import { parseMountTable } from './mount-table.js';

export interface CriuInfo {
  readonly path: string;
  readonly version: string;
}

/**
 * `--tcp-close`: a guest TCP connection that is open, or closed by one side only, at dump time
 * (one the port forwarder brought in, killed just before the dump, leaves the guest's end in
 * CLOSE_WAIT; or two guest apps talking over loopback) makes CRIU refuse the dump ("Connected TCP
 * socket, consider using --tcp-established"). With the flag the dump succeeds and the restore
 * gives such sockets back closed: the app sees its connection end, as after a network drop, and
 * its listening sockets work as before. A dump made with it refuses to restore without it ("Need
 * to set the --tcp-close options"), so it is on both; images dumped without it restore with it.
 * `--tcp-established` would keep loopback connections alive, but needs the network locked during
 * the dump, which `--network-lock skip` turns off, and a peer that is gone (the forwarder's) would
 * only reset later.
 */
const COMMON_FLAGS = ['--network-lock', 'skip', '--manage-cgroups=ignore', '--file-locks', '--tcp-close'];

/**
 * Finds a CRIU 4.x that passes `criu check` and can really dump; null means memory snapshots are
 * unavailable, and `log` is told why.
 */
export async function detectCriu(criuPath: string | undefined, log: (msg: string, fields?: object, level?: 'warn') => void = () => {}): Promise<CriuInfo | null> {
  const candidates = criuPath
    ? [criuPath]
    : [
        ...(process.env.PATH ?? '').split(delimiter).filter(Boolean).map((d) => join(d, 'criu')),
        '/usr/local/sbin/criu',
        '/usr/sbin/criu',
      ];
  for (const path of candidates) {
    try {
      await access(path, constants.X_OK);
    } catch {
      continue;
    }
    const version = await execa(path, ['--version'], { reject: false, timeout: 10_000 });
    const match = /Version:\s*(\d+)\.(\S+)/.exec(version.stdout);
    if (!match || Number(match[1]) < 4) continue;
    const check = await execa(path, ['check'], { reject: false, timeout: 30_000, all: true });
    if (check.exitCode !== 0) {
      log('CRIU found but its check fails on this host', { criu: path, exitCode: check.exitCode ?? null, output: (check.all ?? '').trim().split('\n').slice(-3).join(' | ') }, 'warn');
      continue;
    }
    const problem = await dumpProbe(path);
    if (problem !== null) {
      log('memory snapshots are off: CRIU cannot dump on this host', { criu: path, problem }, 'warn');
      return null;
    }
    const kdat = await ensureKdatCache(path);
    if (kdat === 'made') log('CRIU kernel facts cached for this boot', { file: KDAT_FILE });
    else if (typeof kdat === 'object') log('CRIU probes the kernel on every run: its kernel facts could not be cached', { problem: kdat.failed });
    return { path, version: `${match[1]}.${match[2]}` };
  }
  // Every hibernate here is a cold stop from now on: said once, where operators look.
  log('memory snapshots are off: no CRIU 4.x that passes its check', { looked: candidates }, 'warn');
  return null;
}

/** Where a host's dump probe result is kept until the next boot. */
export const DUMP_PROBE_CACHE = '/run/canto/criu-probe.json';
const DUMP_PROBE_TIMEOUT_MS = 5_000;

/**
 * `criu check` passing does not mean a dump finishes: on some hosts (seen on a virtual AMD Zen 5
 * machine, kernel 6.18) the task never stops at the exit of the parasite's rt_sigreturn, and
 * `criu dump` waits for it for ever, leaving the desktop's processes stopped under ptrace. So one
 * throwaway process is dumped, with a deadline, before snapshots are offered. The answer holds
 * until the next boot or another CRIU binary: it is kept in /run, keyed by both. A failure is
 * only taken after a second probe fails too: one probe that failed for a passing cause (a busy
 * host while the agent starts) turned memory snapshots off until the next boot.
 *
 * Returns null when the dump worked, else what went wrong.
 */
async function dumpProbe(criuPath: string): Promise<string | null> {
  const binary = await stat(criuPath);
  const bootId = (await readFile('/proc/sys/kernel/random/boot_id', 'utf8').catch(() => '')).trim();
  // `probe/2`: the probe taken twice; an answer an older agent cached is probed again.
  const key = `probe/2 ${bootId} ${criuPath} ${binary.size} ${binary.mtimeMs}`;
  try {
    const cached = JSON.parse(await readFile(DUMP_PROBE_CACHE, 'utf8')) as { key?: string; problem?: string | null };
    if (cached.key === key && cached.problem !== undefined) return cached.problem;
  } catch {
    // No answer kept yet (or an unreadable one): probe.
  }
  const problem = (await probeOnce(criuPath)) === null ? null : await probeOnce(criuPath);
  await mkdir(dirname(DUMP_PROBE_CACHE), { recursive: true })
    .then(() => writeFile(DUMP_PROBE_CACHE, JSON.stringify({ key, problem })))
    .catch(() => {});
  return problem;
}

async function probeOnce(criuPath: string): Promise<string | null> {
  const dir = await mkdtemp(join(tmpdir(), 'canto-criu-probe-'));
  // A session leader with no open files: nothing about it needs options to dump.
  const victim = spawn('setsid', ['perl', '-e', 'close STDIN; close STDOUT; close STDERR; sleep 60'], { stdio: 'ignore' });
  try {
    if (victim.pid === undefined) return 'could not start the probe process';
    // Dumped once it runs perl: not in the middle of setsid's exec of it.
    const pid = victim.pid;
    await waitFor(async () => (await readFile(`/proc/${pid}/comm`, 'utf8').catch(() => '')).trim() === 'perl', 2_000, 5);
    const result = await execa(criuPath, ['dump', '-t', String(victim.pid), '-D', dir, '-o', join(dir, 'dump.log'), '--leave-running'], {
      reject: false,
      timeout: DUMP_PROBE_TIMEOUT_MS,
      killSignal: 'SIGKILL',
    });
    if (result.timedOut) return `a test dump did not finish within ${DUMP_PROBE_TIMEOUT_MS} ms`;
    if (result.exitCode !== 0) return `a test dump failed (${result.exitCode}): ${await logTail(join(dir, 'dump.log'))}`;
    return null;
  } finally {
    victim.kill('SIGKILL');
    await rm(dir, { recursive: true, force: true });
  }
}

interface External {
  readonly guestPath: string;
  readonly key: string;
  /**
   * What a cover of a scanned `/etc` secret is made of (a file's `/dev/null`, a directory's empty
   * one), read from the guest at the dump: the host may have deleted the secret since its boot,
   * and may lack it at the restore. Absent for every other mount, and in older images.
   */
  readonly cover?: 'file' | 'dir';
}

/** Bind mounts of the running guest, from the kernel's mountinfo of its init. */
async function guestBindMounts(initPid: number, paths: DesktopPaths): Promise<External[]> {
  const out: External[] = [];
  for (const { mountPoint, fsType } of parseMountTable(await readFile(`/proc/${initPid}/mountinfo`, 'utf8'))) {
    // The root mount is CRIU's --root at restore time, not an external bind.
    if (mountPoint === '/') continue;
    if (['tmpfs', 'proc', 'devpts', 'mqueue', 'sysfs'].includes(fsType)) continue;
    const cover = await etcCoverKind(initPid, paths, mountPoint);
    if (cover === undefined && hostPathForGuestMount(paths, mountPoint) === null) {
      throw new Error(`unexpected mount ${mountPoint} (${fsType}) in the guest`);
    }
    out.push({ guestPath: mountPoint, key: `m${mountPoint.replace(/\//g, '-')}`, ...(cover === undefined ? {} : { cover }) });
  }
  return out;
}

/**
 * A mount in the guest's `/etc` that no fixed cover names is the cover of a secret the agent's
 * scan found (guest/etc-secrets.ts): what is mounted there, seen from the guest's own root, says
 * which kind. The host's file may be gone meanwhile, which once failed every dump of the desktop.
 */
async function etcCoverKind(initPid: number, paths: DesktopPaths, guestPath: string): Promise<'file' | 'dir' | undefined> {
  if (!guestPath.startsWith('/etc/') || guestPath.includes('/../') || bindMounts(paths).has(guestPath)) return undefined;
  const st = await lstat(`/proc/${initPid}/root${guestPath}`).catch(() => null);
  if (st?.isCharacterDevice()) return 'file';
  if (st?.isDirectory()) return 'dir';
  return undefined;
}

/** Where a snapshot's mount comes from on this host; null for one this host cannot give. */
function externalSource(paths: DesktopPaths, e: External): string | null {
  if (e.cover === 'file') return '/dev/null';
  if (e.cover === 'dir') return paths.empty;
  return hostPathForGuestMount(paths, e.guestPath);
}

async function logTail(path: string): Promise<string> {
  const text = await readFile(path, 'utf8').catch(() => '');
  return text
    .split('\n')
    .filter((l) => l.includes('Error'))
    .slice(-4)
    .join(' | ');
}

/**
 * Keeps the images of a dump that ended well after its agent stopped, which the agent would have
 * renamed into place itself: CRIU runs in a process group of its own and goes on when the agent
 * is killed. CRIU writes `stats-dump` last, and only when the dump succeeded (after it has killed
 * the guest), and nothing starts the guest but a start, which removes `snapshot.tmp/` first: such
 * images are the desktop's memory as its disk still is, newer than any images in `snapshot/`
 * (spent ones, which `discardSpent` removes first). True when there were some to keep.
 */
export async function keepFinishedDump(paths: DesktopPaths, discardSpent: () => Promise<void>): Promise<boolean> {
  if (!(await exists(join(paths.snapshotTmp, 'stats-dump')))) return false;
  if (await exists(paths.snapshot)) await discardSpent();
  await rename(paths.snapshotTmp, paths.snapshot);
  return true;
}

/**
 * The guest a restore brought back after its agent stopped, before the agent recorded it: CRIU's
 * pidfile names its init (the caller removes the file once it has recorded one), the desktop
 * answered the restore's check, and the process is still this desktop's. Restoring the same
 * images again would put memory from before that guest ran over the disk it has written since.
 */
export async function orphanedRestore(paths: DesktopPaths, desktopId: string): Promise<InitProcess | null> {
  const pid = Number((await readFile(join(paths.run, 'restore.pid'), 'utf8').catch(() => '')).trim());
  if (!Number.isInteger(pid) || pid <= 0 || !(await exists(join(paths.run, 'restore-answered')))) return null;
  const cgroup = await readFile(`/proc/${pid}/cgroup`, 'utf8').catch(() => '');
  const st = await procStat(pid);
  return st !== null && cgroup.includes(`/canto/${desktopId}\n`) ? { pid, startTime: st.startTime } : null;
}

/** How long a hibernate or start waits for a dump another agent process left running (a dump's own bound). */
const FOREIGN_DUMP_WAIT_MS = 60_000;

/**
 * The guest's running init for a hibernate or a start, once no dump holds it: a dump an agent
 * started before it was killed goes on (CRIU's own process group) and has seized the guest's
 * processes, so its init reads traced. A second dump would fail on them and fall back to a cold
 * stop, killing the guest under the first; a start would adopt a guest that dump then ends. So
 * both wait for that dump to end: the guest then runs on (the dump failed) or is gone with its
 * images (keepFinishedDump keeps them, and a start restores them).
 */
export async function initOnceUndumped(paths: DesktopPaths): Promise<InitProcess | null> {
  const init = await runningInit(paths);
  if (init === null || (await tracerOf(init.pid)) === 0) return init;
  await waitFor(async () => (await tracerOf(init.pid)) === 0, FOREIGN_DUMP_WAIT_MS, 20);
  return runningInit(paths);
}

/** The pid tracing `pid` (0: none, or `pid` is gone). */
async function tracerOf(pid: number): Promise<number> {
  const status = await readFile(`/proc/${pid}/status`, 'utf8').catch(() => '');
  return Number(/^TracerPid:\s+(\d+)$/m.exec(status)?.[1] ?? 0);
}

/** Dumps the guest into `paths.snapshotTmp` (which the caller renames). Throws with CRIU's errors. */
export async function dump(criu: CriuInfo, paths: DesktopPaths, init: InitProcess): Promise<void> {
  await rm(paths.snapshotTmp, { recursive: true, force: true });
  await mkdir(paths.snapshotTmp, { recursive: true });
  const externals = await guestBindMounts(init.pid, paths);
  await writeFile(join(paths.snapshotTmp, 'externals.json'), JSON.stringify(externals));
  await recordConfinement(paths.snapshotTmp, init.pid);
  const logPath = join(paths.run, 'criu-dump.log');
  // The network namespace is dumped without its contents: restores make it empty anyway (below),
  // and recording its links, addresses, routes and firewall tables ran six `ip`/`iptables-save`
  // processes, about 40 ms of a dump's 200 here. Agents of protocol 1.13 and later restore such images;
  // the scheduler moves them to no older agent (scheduler/src/engine/move.ts).
  const args = ['dump', '-t', String(init.pid), '-D', paths.snapshotTmp, '-o', logPath, ...COMMON_FLAGS, '--empty-ns', 'net'];
  for (const e of externals) args.push('--external', `mnt[${e.guestPath}]:${e.key}`);
  // Its own process group: a Ctrl-C at the terminal of `canto up` (which hibernates desktops as
  // it stops) must not abort the dump it is waiting for.
  const { code } = await runToEnd(criu.path, args, { timeoutMs: 60_000, detached: true });
  if (code !== 0) {
    throw new Error(`criu dump failed (${code ?? 'killed'}): ${await logTail(logPath)}`);
  }
}

/** The keeper (agent/guest/criu-keeper.pl): subreaper, runs CRIU, prints `criu-exit N`, then reaps. */
export function criuKeeperProgram(): string {
  return perlProgram([guestFile('criu-keeper.pl')]);
}

/**
 * The keeper's command line: the spawner's keeper mode (agent/native/canto-spawn.c), where it is
 * built, else the shell that joins the cgroups and the Perl keeper.
 */
function keeperArgv(desktopId: string, program: readonly string[]): [string, string[]] {
  const helper = helperPath();
  if (helper !== null) {
    const dirs = cgroupDirs(desktopId);
    return [helper, ['--keep', String(dirs.length), ...dirs, '--', ...program]];
  }
  return ['/bin/sh', [...joinArgv(desktopId), 'perl', '-e', criuKeeperProgram(), '--', ...program]];
}

/** How long the check that a restored desktop answers may take, in seconds. */
const PROBE_SECONDS = 10;

export interface Restored {
  readonly init: InitProcess;
  /**
   * Whether the desktop answered once it resumed (X took a client: the action script's
   * post-resume check); otherwise why not.
   */
  readonly answer: { readonly ok: true } | { readonly ok: false; readonly error: string };
}

/** Restores `paths.snapshot` into fresh namespaces inside the desktop's cgroups. */
export async function restore(
  criu: CriuInfo,
  paths: DesktopPaths,
  desktopId: string,
  skeleton: string,
): Promise<Restored> {
  const externals = JSON.parse(await readFile(join(paths.snapshot, 'externals.json'), 'utf8')) as External[];
  // An image without the cover of a host secret (dumped before the cover existed, or on a host
  // without that secret) would leave the secret readable: the desktop boots cold instead, covered.
  // A file the view of /etc hides by name needs no cover of its own (a secret that appeared on the
  // host after the dump, found by a later agent's scan, is in that agent's mask).
  const mounted = new Set([...externals.map((e) => e.guestPath), ...etcHiddenFor(paths.dir)]);
  const masked = maskedHostPaths();
  const uncovered = [...masked.files, ...masked.dirs, ...maskedProcFiles()].filter((path) => !mounted.has(path));
  if (uncovered.length > 0) {
    throw new Error(`the memory snapshot does not cover what of /etc and /proc a guest must not read (${uncovered.slice(0, 3).join(', ')}${uncovered.length > 3 ? ', …' : ''})`);
  }
  // A guest booted before its confinement existed boots cold instead, confined (confinement.ts).
  await requireConfinement(paths.snapshot);
  // An image whose framebuffer is not mounted inside /dev/run had a /run tmpfs of its own.
  await ensureSkeletonRun(skeleton, !externals.some((e) => e.guestPath === GUEST_FB_DIR));
  const pidfile = join(paths.run, 'restore.pid');
  const logPath = join(paths.run, 'criu-restore.log');
  const probeFile = join(paths.run, 'restore-answered');
  await rm(pidfile, { force: true });
  await rm(probeFile, { force: true });
  const args = [
    'restore', '-d', '-D', paths.snapshot, '-o', logPath, '--pidfile', pidfile,
    '--root', skeleton, ...COMMON_FLAGS,
  ];
  for (const e of externals) {
    const host = externalSource(paths, e);
    if (host === null) throw new Error(`snapshot names unknown mount ${e.guestPath}`);
    args.push('--external', `mnt[${e.key}]:${host}`);
  }
  // The guest's network namespace is made empty and only its loopback brought up, and its root
  // made read-only and hostname set before it resumes, and once it runs it is asked whether it
  // answers (the action script says why). Images dumped by older agents, which hold the whole
  // namespace, restore the same way. Where the process spawner is built, it is CRIU's action
  // script (agent/native/restore-action.c) and does all three itself, sparing a shell and the
  // programs it runs (nsenter, ip, mount, timeout, setpriv, xrandr) at CRIU's stages.
  let actionScript = helperPath();
  if (actionScript === null) {
    actionScript = join(paths.run, 'criu-restore-action.sh');
    await writeFile(actionScript, guestFile('criu-restore-action.sh'), { mode: 0o700 });
  }
  args.push('--empty-ns', 'net', '--action-script', actionScript);
  const child = await spawnProcess(...keeperArgv(desktopId, [criu.path, ...args]), {
    detached: true,
    stdio: ['ignore', 'pipe', 'ignore'],
    // For the action script: the guest's hostname (post-restore), and the check's limits and
    // where it reports (post-resume).
    env: {
      PATH: '/usr/sbin:/usr/bin:/sbin:/bin',
      CANTO_GUEST_HOSTNAME: hostnameFor(desktopId),
      CANTO_GUEST_BOUNDING_SET: GUEST_CAPS_ONLY[1]!,
      CANTO_PROBE_FILE: probeFile,
      CANTO_PROBE_SECONDS: String(PROBE_SECONDS),
    },
  });
  child.unref();
  const line = await new Promise<string>((resolve) => {
    let text = '';
    const out = child.stdout as Readable;
    const finish = () => {
      out.destroy();
      resolve(text);
    };
    out.on('data', (c: Buffer) => {
      text += c.toString('utf8');
      if (text.includes('\n')) finish();
    });
    out.on('end', finish);
    out.on('error', finish);
  });
  const code = /criu-exit (\d+)/.exec(line)?.[1];
  if (code !== '0') {
    throw new Error(`criu restore failed (${code ?? 'keeper died'}): ${await logTail(logPath)}`);
  }
  const pid = Number((await readFile(pidfile, 'utf8')).trim());
  const st = await procStat(pid);
  if (st === null) throw new Error('restored init is not running');
  const init = { pid, startTime: st.startTime };
  if (await exists(probeFile)) return { init, answer: { ok: true } };
  const said = (await readFile(`${probeFile}.err`, 'utf8').catch(() => '')).trim().slice(0, 300);
  return { init, answer: { ok: false, error: said === '' ? 'X took no client' : said } };
}
