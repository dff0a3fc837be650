/**
 * On-disk layout of the sandbox driver. Everything a desktop owns lives under one directory,
 * `<stateDir>/desktops/<desktopId>/`, so destroying a desktop is one recursive removal and a later
 * fork is a copy of that directory:
 *
 *   disk/           the guest's writable layer: root/ home/ tmp/ var/ (bind-mounted into the guest)
 *   fb/             Xvfb's `-fbdir` (the XWD framebuffer file), mounted at /dev/run/canto-fb
 *   snapshot/       CRIU images, present only while hibernated with a memory snapshot
 *   rootfs/         the empty root CRIU restores into (`--root`): mountpoints and symlinks
 *   run/            driver-only runtime files: init.json (host pid of the guest init), logs
 *   first-boot-done marker: the first-boot spec was applied to this disk
 *
 * Only `disk/` and `fb/` are visible to the guest. Files the driver trusts (the marker, init.json,
 * snapshots) sit beside them where the guest cannot write.
 */
import { randomBytes } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { chmod, cp, lstat, mkdir, readFile, rename, rm, rmdir, stat, symlink, unlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { AgentFailure } from '../../../../../shared/src/protocol.js';
import { runToEnd } from './spawner.js';

/** Desktop ids are opaque to the driver, but they become path components, so they are checked. */
const DESKTOP_ID = /^dsk_[0-9a-v]{24}$/;

export function isDesktopId(name: string): boolean {
  return DESKTOP_ID.test(name);
}

export function assertDesktopId(desktopId: string): void {
  if (!isDesktopId(desktopId)) {
    throw new AgentFailure('bad_request', `invalid desktop id ${JSON.stringify(desktopId)}`, false);
  }
}

/** Writable guest directories, each a sub-directory of `disk/` bind-mounted at `/<name>`. */
export const DISK_DIRS = ['root', 'home', 'tmp', 'var'] as const;

/** Read-only host directories shown to the guest at the same path. */
export const HOST_RO_DIRS = ['/usr', '/etc'] as const;

/** Merged-/usr symlinks created in the guest's root, as on Debian. */
export const ROOT_SYMLINKS: ReadonlyArray<readonly [name: string, target: string]> = [
  ['bin', 'usr/bin'],
  ['sbin', 'usr/sbin'],
  ['lib', 'usr/lib'],
  ['lib64', 'usr/lib64'],
];

/**
 * The guest's `/run`: a directory of `/dev`'s tmpfs, which a symlink in the root names `/run`.
 * Not a tmpfs of its own: CRIU copies each tmpfs through `tar --gzip` at every dump and restore,
 * two processes each time, and this one held three empty directories (docs/decisions.md).
 */
export const GUEST_RUN_DIR = '/dev/run';

/** Where the framebuffer directory is mounted in the guest (`/run/canto-fb` to its programs). */
export const GUEST_FB_DIR = `${GUEST_RUN_DIR}/canto-fb`;

/**
 * Where it was mounted in images dumped before protocol 1.14, whose `/run` was a tmpfs of its
 * own. Such an image still restores: its skeleton gets a `/run` directory (`ensureSkeletonRun`).
 */
export const LEGACY_GUEST_FB_DIR = '/run/canto-fb';

export interface DesktopPaths {
  readonly dir: string;
  readonly disk: string;
  readonly fb: string;
  readonly snapshot: string;
  readonly snapshotTmp: string;
  readonly rootfs: string;
  /** Always empty: what the guest sees, read-only, where a host directory is masked. */
  readonly empty: string;
  readonly run: string;
  readonly initFile: string;
  readonly firstBootMarker: string;
}

/** Marks a golden template's directory (host/golden.ts): not a desktop the scheduler knows. */
export const TEMPLATE_FILE = 'template.json';
/** In a desktop made from a golden template, until its first start: the template's id. */
export const TEMPLATE_CLONE_FILE = 'template-clone';

export function desktopsDir(stateDir: string): string {
  return join(stateDir, 'desktops');
}

/** Where a move's import stages a desktop before renaming it into `desktopsDir`. */
export function incomingDir(stateDir: string): string {
  return join(stateDir, 'incoming');
}

/** Where destroyed desktops and collected layers wait for their removal (discarded.ts). */
export function discardedDir(stateDir: string): string {
  return join(stateDir, 'discarded');
}

export function desktopPaths(stateDir: string, desktopId: string): DesktopPaths {
  assertDesktopId(desktopId);
  const dir = join(desktopsDir(stateDir), desktopId);
  return {
    dir,
    disk: join(dir, 'disk'),
    fb: join(dir, 'fb'),
    snapshot: join(dir, 'snapshot'),
    snapshotTmp: join(dir, 'snapshot.tmp'),
    rootfs: join(dir, 'rootfs'),
    empty: join(dir, 'empty'),
    run: join(dir, 'run'),
    initFile: join(dir, 'run', 'init.json'),
    firstBootMarker: join(dir, 'first-boot-done'),
  };
}

export async function exists(path: string): Promise<boolean> {
  try {
    await stat(path);
    return true;
  } catch {
    return false;
  }
}

/**
 * Creates the disk if missing. `var/run` and `var/lock` point at the guest's tmpfs `/run`, as on
 * Debian; the `.ready` file is written last so a half-created disk is completed on the next call.
 */
export async function ensureDisk(paths: DesktopPaths): Promise<void> {
  if (await exists(join(paths.dir, '.ready'))) return;
  for (const d of DISK_DIRS) await mkdir(join(paths.disk, d), { recursive: true });
  await mkdir(join(paths.disk, 'var', 'log'), { recursive: true });
  await mkdir(paths.fb, { recursive: true });
  await mkdir(paths.run, { recursive: true });
  await chmod(join(paths.disk, 'tmp'), 0o1777);
  await chmod(join(paths.disk, 'root'), 0o700);
  await seedFontCache(paths.disk);
  for (const [name, target] of [
    ['run', '/run'],
    ['lock', '/run/lock'],
  ] as const) {
    await symlink(target, join(paths.disk, 'var', name)).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== 'EEXIST') throw err;
    });
  }
  await writeFile(join(paths.dir, '.ready'), '');
}

/** The host's fontconfig cache, built by the font packages for the fonts the guest sees in /usr. */
export const HOST_FONT_CACHE = '/var/cache/fontconfig';

/**
 * A new disk starts with a copy of the host's fontconfig cache. The guest's /var is its own, and
 * without a cache openbox's first start builds one from every font under /usr: about 1.3 s of CPU
 * per desktop, so ten desktops booting at once on two cores took minutes and timed out. The
 * cache stays valid in the guest because it sees the host's fonts, read-only, at the same paths
 * and times. Best effort: without one, the guest builds its own as before.
 */
async function seedFontCache(disk: string): Promise<void> {
  const target = join(disk, 'var', 'cache', 'fontconfig');
  try {
    await cp(HOST_FONT_CACHE, target, { recursive: true, force: false, errorOnExist: false });
  } catch {
    // No host cache (or unreadable): the guest's fontconfig builds one.
  }
}

export async function hasDisk(paths: DesktopPaths): Promise<boolean> {
  return exists(join(paths.dir, '.ready'));
}

export function hasDiskSync(paths: DesktopPaths): boolean {
  return existsSync(join(paths.dir, '.ready'));
}

/**
 * The skeleton matches the root bwrap builds (see guest-init.ts), which CRIU needs on restore. It
 * is per desktop because CRIU binds it read-write until the driver remounts it read-only.
 */
export async function ensureSkeleton(root: string, extraMountpoints: readonly string[]): Promise<void> {
  for (const d of [...HOST_RO_DIRS, ...DISK_DIRS.map((d) => `/${d}`), ...extraMountpoints]) {
    await mkdir(join(root, d), { recursive: true });
  }
  for (const [name, target] of ROOT_SYMLINKS) {
    await symlink(target, join(root, name)).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== 'EEXIST') throw err;
    });
  }
}

/**
 * The skeleton's `/run` for restoring an image: the symlink bwrap's root has (`legacy` false),
 * or, for an image whose `/run` was a tmpfs of its own, the directory it is mounted on. Only
 * while the desktop is stopped: removing a mountpoint that a running guest's mount namespace
 * still uses would take its `/run` away.
 */
export async function ensureSkeletonRun(root: string, legacy: boolean): Promise<void> {
  const path = join(root, 'run');
  const now = await lstat(path).catch((err: NodeJS.ErrnoException) => {
    if (err.code === 'ENOENT') return null;
    throw err;
  });
  if (legacy) {
    if (now?.isDirectory()) return;
    if (now !== null) await unlink(path);
    await mkdir(path);
    return;
  }
  if (now?.isSymbolicLink()) return;
  // An empty mountpoint of an earlier layout: rmdir refuses anything else.
  if (now !== null) await rmdir(path);
  await symlink(GUEST_RUN_DIR, path);
}

/** Writes a file atomically (temp file + rename) so a crash never leaves half a record. */
export async function writeFileAtomic(path: string, content: string): Promise<void> {
  // Unique per write, not per process: two writers of one file in one agent must not share it.
  const tmp = `${path}.${process.pid}.${randomBytes(6).toString('hex')}.tmp`;
  await writeFile(tmp, content, { mode: 0o600 });
  await rename(tmp, path);
}

/**
 * Writes to disk everything the filesystem holding `path` still keeps only in memory (syncfs(2),
 * through coreutils' `sync --file-system`). A copy another host deletes its own on the strength of
 * must outlive a power loss here: the page cache alone keeps written data up to half a minute.
 * One call covers every file of a desktop in one journal commit, where an fsync per file costs a
 * commit each (thousands for a disk of small files); it also writes what other desktops have
 * pending on that filesystem, which is bounded by the kernel's dirty limits.
 */
export async function syncFilesystem(path: string): Promise<void> {
  const { code, stderr } = await runToEnd('sync', ['--file-system', path]);
  if (code !== 0) throw new AgentFailure('runtime_error', `writing ${path} to disk failed: ${stderr || `sync exited with ${String(code)}`}`, true);
}

export async function readJson<T>(path: string): Promise<T | null> {
  try {
    return JSON.parse(await readFile(path, 'utf8')) as T;
  } catch {
    return null;
  }
}

export function readJsonSync<T>(path: string): T | null {
  try {
    return JSON.parse(readFileSync(path, 'utf8')) as T;
  } catch {
    return null;
  }
}

export async function removeTree(path: string): Promise<void> {
  await rm(path, { recursive: true, force: true, maxRetries: 3 });
}
