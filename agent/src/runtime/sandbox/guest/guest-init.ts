/**
 * What a desktop is, as bubblewrap sees it: the namespaces, the pivoted root, and the guest init.
 *
 * The root is bwrap's own tmpfs holding only mountpoints and the merged-/usr symlinks, remounted
 * read-only; `/usr` and `/etc` are read-only binds of the host's; `/root /home /tmp /var` are binds
 * of the desktop's disk; `/dev` and `/proc` are the guest's own, and `/dev/shm` and `/run` (a
 * symlink to `/dev/run`) are directories of `/dev`'s tmpfs. This is the
 * shape CRIU can dump and restore: every bind mount is declared external at dump time under a
 * stable key (never a host path), and mapped back to a host path at restore time, so the image
 * names no desktop-specific host path and can be restored under another desktop's directories.
 *
 * The guest init is a small POSIX shell script (agent/guest/init.sh) running as pid 1 in its own session (CRIU refuses
 * a session leader outside the pid namespace). It reopens its stdio inside the guest (CRIU cannot
 * dump an fd pointing at a host mount), starts Xvfb at its maximum size and waits for it through
 * `-displayfd`, shrinks the screen to the default size with xrandr, starts openbox and waits until
 * it manages the screen, reports `ready` on fd 4 and then only reaps orphans.
 */
import { existsSync, lstatSync } from 'node:fs';
import { hostEtcSecrets } from './etc-secrets.js';
import { join } from 'node:path';
import { guestFile } from './guest-programs.js';
import { GUEST_FILTER_FD } from './guest-filter.js';
import { SEALED_PROC_PATHS } from '../host/proc-seal.js';
import { etcSourceFor } from '../host/etc-view.js';
import {
  DISK_DIRS,
  GUEST_FB_DIR,
  GUEST_RUN_DIR,
  HOST_RO_DIRS,
  LEGACY_GUEST_FB_DIR,
  ROOT_SYMLINKS,
  type DesktopPaths,
} from '../host/layout.js';

export const MAX_SCREEN = '2560x1600';
export const DEFAULT_SCREEN = '1024x768';

export const GUEST_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

/** The environment every guest process starts from (init and exec). */
export const GUEST_ENV: Readonly<Record<string, string>> = {
  PATH: GUEST_PATH,
  HOME: '/root',
  USER: 'root',
  LOGNAME: 'root',
  SHELL: '/bin/sh',
  LANG: 'C.UTF-8',
  DISPLAY: ':0',
};

/**
 * Capabilities guest processes keep. The guest is root without a user namespace, so the full set
 * would let it remount the read-only binds, mknod the host's disk or open_by_handle_at its way out.
 * This is Docker's default set without CAP_MKNOD: enough for package tools, chown, setuid daemons.
 */
export const GUEST_CAPS = [
  'chown', 'dac_override', 'fowner', 'fsetid', 'kill', 'setgid', 'setuid', 'setpcap',
  'setfcap', 'net_bind_service', 'net_raw', 'sys_chroot', 'audit_write',
] as const;

/** Each of GUEST_CAPS's numbers (linux/capability.h). */
const CAP_NUMBERS: Readonly<Record<(typeof GUEST_CAPS)[number], number>> = {
  chown: 0, dac_override: 1, fowner: 3, fsetid: 4, kill: 5, setgid: 6, setuid: 7, setpcap: 8,
  net_bind_service: 10, net_raw: 13, sys_chroot: 18, audit_write: 29, setfcap: 31,
};

/** GUEST_CAPS as a capability mask (what `/proc/<pid>/status` shows as CapBnd of guest code). */
export const GUEST_CAP_MASK: number = GUEST_CAPS.reduce((mask, cap) => mask + 2 ** CAP_NUMBERS[cap], 0);

/** `setpriv` down to the guest's bounding set: the prefix of anything that runs guest code. */
export const GUEST_CAPS_ONLY: readonly string[] = [
  '/usr/bin/setpriv', `--bounding-set=-all,${GUEST_CAPS.map((c) => `+${c}`).join(',')}`,
];

/**
 * nsenter into every namespace of the guest init (its pid namespace too). The time namespace
 * matters after a restore: CRIU restores a desktop into a time namespace of its own (its clocks
 * continue where they stopped), and a process that entered without it would be the one task of
 * the next snapshot in another time namespace, which CRIU cannot restore ("Can't restore sub-task
 * in NS"): the desktop would then wake cold. No `--root`: joining the mount namespace puts the
 * process at that namespace's root, which bwrap (or CRIU) made the guest's root, whereas the
 * init's own root (`/proc/<init>/root`, what `--root` takes) is wherever the guest last chrooted
 * its init to, and a guest may trace its init (guest-enter.c checks the same for the spawner).
 */
export function nsenterArgv(nsenterPath: string, initPid: number, workdir = '/'): string[] {
  return [nsenterPath, '-t', String(initPid), '-m', '-u', '-i', '-n', '-p', '-T', `--wdns=${workdir}`];
}

/** Mountpoints that are created inside guest-owned mounts (not in the root skeleton). */
export const NESTED_MOUNTPOINTS = ['/dev', '/proc'] as const;

/**
 * Host secrets inside the shared read-only `/etc`, covered even where their modes would let others
 * read them: each file by a read-only bind of `/dev/null`, so a guest (root inside its namespaces)
 * reads an empty file instead of the host's password hashes. The rest of what only the host's
 * root may read there is found by etc-secrets.ts and covered the same way.
 */
export const MASKED_HOST_FILES = ['/etc/shadow', '/etc/shadow-', '/etc/gshadow', '/etc/gshadow-'] as const;
/**
 * Host secret directories inside `/etc`, each covered by a read-only bind of the desktop's empty
 * directory (`DesktopPaths.empty`). A bind, not an empty tmpfs: CRIU copies every tmpfs through
 * `tar --gzip` at each dump and restore (≈7 ms each here), and only names a bind.
 */
export const MASKED_HOST_DIRS = ['/etc/ssl/private'] as const;

/**
 * Files of the guest's own /proc that show the whole host, each covered by a read-only bind of
 * `/dev/null` as Docker covers them: timers and scheduler state name every task on the host with
 * its pid, and the key lists name root's keys, which every guest's root is (guest-filter.ts keeps
 * guests from the keys themselves). Those this kernel has (the guest's kernel is the host's).
 */
export const MASKED_PROC_FILES = ['/proc/timer_list', '/proc/sched_debug', '/proc/keys', '/proc/key-users', '/proc/kcore'] as const;

/** MASKED_PROC_FILES this kernel has. */
export function maskedProcFiles(): string[] {
  return MASKED_PROC_FILES.filter((f) => existsSync(f));
}

/** The files and directories of the host's `/etc` a new desktop gets covered, as they exist now. */
export function maskedHostPaths(): { files: string[]; dirs: string[] } {
  const secrets = hostEtcSecrets();
  return {
    files: [...new Set([...MASKED_HOST_FILES, ...secrets.files])].filter((f) => existsSync(f)),
    dirs: [...new Set([...MASKED_HOST_DIRS, ...secrets.dirs])].filter((d) => existsSync(d)),
  };
}

/** Guest mountpoint → host path for every bind mount of a desktop, for CRIU's externals. */
export function bindMounts(paths: DesktopPaths): Map<string, string> {
  const m = new Map<string, string>();
  for (const d of HOST_RO_DIRS) m.set(d, d === '/etc' ? etcSourceFor(paths.dir) : d);
  for (const f of MASKED_HOST_FILES) m.set(f, '/dev/null');
  for (const f of MASKED_PROC_FILES) m.set(f, '/dev/null');
  for (const d of MASKED_HOST_DIRS) m.set(d, paths.empty);
  for (const d of DISK_DIRS) m.set(`/${d}`, join(paths.disk, d));
  m.set(GUEST_FB_DIR, paths.fb);
  m.set(LEGACY_GUEST_FB_DIR, paths.fb);
  return m;
}

/**
 * bwrap --dev binds single device nodes from the host's /dev; they map back to the same path. A
 * cover inside `/etc` (the image may come from another host, or from an agent that scanned
 * before) maps to what covers its kind here; one whose path this host lacks maps to nothing, and
 * the restore fails (the desktop then boots cold, covered as this host's scan says).
 */
export function hostPathForGuestMount(paths: DesktopPaths, guestPath: string): string | null {
  const known = bindMounts(paths).get(guestPath);
  if (known !== undefined) return known;
  if (/^\/dev\/[a-z]+$/.test(guestPath)) return guestPath;
  if (guestPath.startsWith('/etc/') && !guestPath.includes('/../')) {
    try {
      const st = lstatSync(guestPath);
      if (st.isDirectory()) return paths.empty;
      if (st.isFile()) return '/dev/null';
    } catch {
      return null;
    }
  }
  return null;
}

export function hostnameFor(desktopId: string): string {
  return desktopId.replace(/_/g, '-');
}

/** The descriptor bwrap waits on before the guest's first instruction (host/cold-boot.ts writes it). */
export const GUEST_BLOCK_FD = 7;

/**
 * bwrap's argv. The info fd (3) reports the guest init's host pid; fd 4 carries `ready`; with
 * `envOnFd5`, fd 5 carries the env file the init writes before anything else (a first boot); fd 6
 * carries the seccomp filter (guest-filter.ts); bwrap waits on fd 7 with the namespaces made and
 * the guest not started, while the agent seals the host-wide parts of its /proc (host/proc-seal.ts).
 */
export function bwrapArgs(paths: DesktopPaths, desktopId: string, envOnFd5 = false): string[] {
  const args = [
    '--unshare-pid', '--unshare-ipc', '--unshare-net', '--unshare-uts',
    '--hostname', hostnameFor(desktopId),
  ];
  // `/etc` through the view whose mask shadows the host's secrets by name (host/etc-view.ts).
  for (const d of HOST_RO_DIRS) args.push('--ro-bind', d === '/etc' ? etcSourceFor(paths.dir) : d, d);
  const masked = maskedHostPaths();
  for (const f of masked.files) args.push('--ro-bind', '/dev/null', f);
  for (const d of masked.dirs) args.push('--ro-bind', paths.empty, d);
  for (const [name, target] of ROOT_SYMLINKS) args.push('--symlink', target, `/${name}`);
  args.push('--symlink', GUEST_RUN_DIR, '/run');
  for (const d of DISK_DIRS) args.push('--bind', join(paths.disk, d), `/${d}`);
  args.push(
    // /dev/shm (init.sh opens it to everyone) and /run are directories of /dev's tmpfs, not
    // tmpfs mounts of their own: CRIU copies each tmpfs through `tar --gzip` at every dump and
    // restore, two processes each time.
    '--dev', '/dev',
    '--proc', '/proc',
    ...maskedProcFiles().flatMap((f) => ['--ro-bind', '/dev/null', f]),
    '--dir', GUEST_RUN_DIR,
    '--bind', paths.fb, GUEST_FB_DIR,
    '--remount-ro', '/',
    '--chdir', '/root',
    '--seccomp', String(GUEST_FILTER_FD),
    '--block-fd', String(GUEST_BLOCK_FD),
    '--cap-drop', 'ALL',
    ...GUEST_CAPS.flatMap((c) => ['--cap-add', `CAP_${c.toUpperCase()}`]),
    '--as-pid-1',
    '--new-session',
    '--info-fd', '3',
    '/bin/sh', '-c', guestFile('init.sh'), 'canto-init', MAX_SCREEN, DEFAULT_SCREEN, GUEST_FB_DIR, envOnFd5 ? 'env-on-fd5' : '-',
    // What the init checks is read-only before it goes on (host/proc-seal.ts).
    ...SEALED_PROC_PATHS,
  );
  return args;
}
