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
 * as the reaper of the restored init — detached from the agent, so desktops outlive it. Perl is
 * used for the keeper because it is always present on Debian and can call prctl directly.
 */
import { spawn } from 'node:child_process';
import { access, constants, mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { delimiter, join } from 'node:path';
import type { Readable } from 'node:stream';
import { execa } from 'execa';
import { joinArgv } from './cgroups.js';
import { procStat } from './host-procs.js';
import type { DesktopPaths } from './layout.js';
import { hostPathForGuestMount } from './guest-init.js';
import type { InitProcess } from './cold-boot.js';

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

/** Finds a CRIU 4.x that passes `criu check`; null means memory snapshots are unavailable. */
export async function detectCriu(criuPath: string | undefined): Promise<CriuInfo | null> {
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
    if (check.exitCode !== 0) continue;
    return { path, version: `${match[1]}.${match[2]}` };
  }
  return null;
}

interface External {
  readonly guestPath: string;
  readonly key: string;
}

/** Bind mounts of the running guest, from the kernel's mountinfo of its init. */
async function guestBindMounts(initPid: number, paths: DesktopPaths): Promise<External[]> {
  const text = await readFile(`/proc/${initPid}/mountinfo`, 'utf8');
  const out: External[] = [];
  for (const line of text.split('\n')) {
    const fields = line.split(' ');
    const sep = fields.indexOf('-');
    const mountpoint = fields[4];
    const fstype = fields[sep + 1];
    if (sep < 0 || mountpoint === undefined || fstype === undefined) continue;
    // The root mount is CRIU's --root at restore time, not an external bind.
    if (mountpoint === '/') continue;
    if (['tmpfs', 'proc', 'devpts', 'mqueue', 'sysfs'].includes(fstype)) continue;
    if (hostPathForGuestMount(paths, mountpoint) === null) {
      throw new Error(`unexpected mount ${mountpoint} (${fstype}) in the guest`);
    }
    out.push({ guestPath: mountpoint, key: `m${mountpoint.replace(/\//g, '-')}` });
  }
  return out;
}

async function logTail(path: string): Promise<string> {
  const text = await readFile(path, 'utf8').catch(() => '');
  return text
    .split('\n')
    .filter((l) => l.includes('Error'))
    .slice(-4)
    .join(' | ');
}

/** Dumps the guest into `paths.snapshotTmp` (which the caller renames). Throws with CRIU's errors. */
export async function dump(criu: CriuInfo, paths: DesktopPaths, init: InitProcess): Promise<void> {
  await rm(paths.snapshotTmp, { recursive: true, force: true });
  await mkdir(paths.snapshotTmp, { recursive: true });
  const externals = await guestBindMounts(init.pid, paths);
  await writeFile(join(paths.snapshotTmp, 'externals.json'), JSON.stringify(externals));
  const logPath = join(paths.run, 'criu-dump.log');
  const args = ['dump', '-t', String(init.pid), '-D', paths.snapshotTmp, '-o', logPath, ...COMMON_FLAGS];
  for (const e of externals) args.push('--external', `mnt[${e.guestPath}]:${e.key}`);
  const result = await execa(criu.path, args, { reject: false, timeout: 60_000 });
  if (result.exitCode !== 0) {
    throw new Error(`criu dump failed (${result.exitCode}): ${await logTail(logPath)}`);
  }
}

/** The keeper: subreaper, runs CRIU, prints `criu-exit N`, then reaps until its children are gone. */
const KEEPER = `
$SIG{PIPE} = 'IGNORE';
syscall(157, 36, 1, 0, 0, 0) == 0 or die "prctl(PR_SET_CHILD_SUBREAPER): $!";
my $pid = fork() // die "fork: $!";
if ($pid == 0) { exec @ARGV or exit 127; }
waitpid($pid, 0);
my $code = $? & 127 ? 128 + ($? & 127) : $? >> 8;
print STDOUT "criu-exit $code\\n";
close STDOUT;
open STDOUT, '>', '/dev/null';
open STDERR, '>', '/dev/null';
exit $code if $code;
1 while wait() != -1;
`;

/** Restores `paths.snapshot` into fresh namespaces inside the desktop's cgroups. */
export async function restore(
  criu: CriuInfo,
  paths: DesktopPaths,
  desktopId: string,
  skeleton: string,
): Promise<InitProcess> {
  if (process.arch !== 'x64') throw new Error('the CRIU keeper knows the prctl syscall number for x86-64 only');
  const externals = JSON.parse(await readFile(join(paths.snapshot, 'externals.json'), 'utf8')) as External[];
  const pidfile = join(paths.run, 'restore.pid');
  const logPath = join(paths.run, 'criu-restore.log');
  await rm(pidfile, { force: true });
  const args = [
    'restore', '-d', '-D', paths.snapshot, '-o', logPath, '--pidfile', pidfile,
    '--root', skeleton, ...COMMON_FLAGS,
  ];
  for (const e of externals) {
    const host = hostPathForGuestMount(paths, e.guestPath);
    if (host === null) throw new Error(`snapshot names unknown mount ${e.guestPath}`);
    args.push('--external', `mnt[${e.key}]:${host}`);
  }
  const child = spawn('/bin/sh', [...joinArgv(desktopId), 'perl', '-e', KEEPER, '--', criu.path, ...args], {
    detached: true,
    stdio: ['ignore', 'pipe', 'ignore'],
    env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin' },
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
  return { pid, startTime: st.startTime };
}
