/**
 * The host's `/etc` as guests see it: a read-only overlay whose top layer shadows every secret by
 * name. Guests used to get the host's `/etc` itself, each secret covered by a bind mount of
 * `/dev/null` on the secret's own dentry. The kernel lazily detaches a mount whose mountpoint is
 * unlinked or renamed over in another mount namespace, and host tools replace files by rename:
 * `passwd` writes `/etc/shadow+` and renames it over `/etc/shadow`, `sed -i` and configuration
 * management do the same to any file (the agent's `/etc/canto/agent.env` with its join token).
 * After that, every running guest read the new file (measured, and now a test).
 *
 * The overlay's top layer (the mask) holds an empty file at each secret's path, and an overlay
 * looks a name up in its top layer first, so what the host does to its own file never reaches a
 * guest. The covers of guest-init.ts stay on top, as before, and a snapshot that names them
 * restores as before: they now sit on the mask's dentries, which nothing renames.
 *
 * A mask is built once per set of secrets, in its own directory named by their hash, and never
 * changed afterwards: an overlay's layers must not change under it, and guests booted by an
 * earlier agent process keep theirs mounted. The view is mounted read-only (no upper layer), once
 * per agent process; the host's later changes to other files of `/etc` show through it. Without
 * overlay support, or under a state directory whose path an overlay cannot name, the driver
 * falls back to the host's `/etc` and says so.
 */
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { chmod, chown, lstat, mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { parseMountTable } from './mount-table.js';
import { runToEnd } from './spawner.js';

/** Where masks and views live under the driver's state directory. */
export const ETC_VIEW_DIR = 'etc-view';
/** Written once a mask is complete: only a complete mask is ever mounted. */
const READY = 'ready';

/**
 * Mounts (or finds mounted) the view of `/etc` with `secretFiles` (absolute paths under `/etc`)
 * shadowed; answers its path, or null when it cannot (the caller keeps the host's `/etc`).
 */
export async function mountEtcView(stateDir: string, secretFiles: readonly string[], log: (msg: string, fields?: object, level?: 'warn') => void, etc = '/etc'): Promise<string | null> {
  const files = [...new Set(secretFiles)].filter((f) => f.startsWith(`${etc}/`) && !f.includes('/../')).sort();
  const key = createHash('sha256').update(JSON.stringify([etc, files])).digest('hex').slice(0, 16);
  const base = join(stateDir, ETC_VIEW_DIR, key);
  const mask = join(base, 'mask');
  const view = join(base, 'view');
  // The overlay's option string separates layers with `:` and options with `,`.
  if (/[:,\\\s]/.test(mask) || /[:,\\\s]/.test(etc)) {
    log("the guests' /etc is the host's, with covers a rename on the host undoes: the state directory's path cannot name an overlay layer", { stateDir }, 'warn');
    return null;
  }
  try {
    if (await isMountPoint(view)) return view;
    if ((await readFile(join(base, READY), 'utf8').catch(() => null)) === null) await buildMask(mask, etc, files, join(base, READY));
    await mkdir(view, { recursive: true, mode: 0o755 });
    const mounted = await runToEnd('mount', ['-t', 'overlay', 'canto-etc', '-o', `ro,lowerdir=${mask}:${etc}`, view], { timeoutMs: 10_000 });
    if (mounted.code !== 0) throw new Error(`mount exited with ${String(mounted.code)}: ${mounted.stderr.trim()}`);
    return view;
  } catch (err) {
    log("the guests' /etc is the host's, with covers a rename on the host undoes: its view could not be mounted", { view, error: String(err) }, 'warn');
    return null;
  }
}

/**
 * The view each driver's guests get, by the driver's state directory, and how many drivers of
 * this process use it (a test, or a cleanup, may open a second one on the same directory).
 */
const views = new Map<string, { readonly view: string; refs: number; readonly log: Log; warned: boolean }>();

type Log = (msg: string, fields?: object, level?: 'warn') => void;

/**
 * Mounts the view for the driver at `stateDir` (mountEtcView) and gives it to the guests it
 * boots; answers it, or null where its guests get the host's `/etc`.
 */
export async function acquireEtcView(stateDir: string, secretFiles: readonly string[], log: (msg: string, fields?: object, level?: 'warn') => void): Promise<string | null> {
  const key = resolve(stateDir);
  const held = views.get(key);
  if (held !== undefined) {
    held.refs++;
    return held.view;
  }
  const view = await mountEtcView(stateDir, secretFiles, log);
  if (view !== null) views.set(key, { view, refs: 1, log, warned: false });
  return view;
}

/**
 * A driver that acquired the view closes: the last one of this process unmounts it (its guests
 * keep theirs: each holds a bind of its own, and the next agent mounts it again).
 */
export async function releaseEtcView(stateDir: string): Promise<void> {
  const key = resolve(stateDir);
  const held = views.get(key);
  if (held === undefined || --held.refs > 0) return;
  views.delete(key);
  await runToEnd('umount', ['-l', held.view], { timeoutMs: 10_000 }).catch(() => undefined);
}

/**
 * What a desktop under `<stateDir>/desktops/<id>` (`desktopDir`) gets as its `/etc`: the view
 * while it is mounted (a view unmounted under the agent would be an empty directory, and a guest
 * without `/etc` does not boot), else the host's.
 */
export function etcSourceFor(desktopDir: string): string {
  const held = views.get(dirname(dirname(desktopDir)));
  if (held === undefined) return '/etc';
  if (existsSync(join(held.view, 'passwd'))) return held.view;
  if (!held.warned) {
    held.warned = true;
    held.log("the guests' /etc is the host's, with covers a rename on the host undoes: its view was unmounted under the agent; restart the agent", { view: held.view }, 'warn');
  }
  return '/etc';
}

/**
 * Builds the mask afresh: an empty file at each secret's path, in directories that carry their
 * host counterparts' owner and mode (an overlay shows a directory's attributes from its top
 * layer), the top one `/etc`'s own.
 */
async function buildMask(mask: string, etc: string, files: readonly string[], ready: string): Promise<void> {
  // Never mounted while not ready, so nothing uses what is left of an interrupted build.
  await rm(mask, { recursive: true, force: true });
  await mkdir(mask, { recursive: true });
  const dirs = new Set<string>([etc]);
  for (const file of files) for (let d = dirname(file); d.startsWith(etc) && !dirs.has(d); d = dirname(d)) dirs.add(d);
  for (const dir of [...dirs].sort()) {
    const inMask = join(mask, dir.slice(etc.length));
    await mkdir(inMask, { recursive: true });
    const st = await lstat(dir);
    await chown(inMask, st.uid, st.gid);
    await chmod(inMask, st.mode & 0o7777);
  }
  for (const file of files) await writeFile(join(mask, file.slice(etc.length)), '', { mode: 0o644 });
  await writeFile(ready, `${files.length}\n`);
}

async function isMountPoint(dir: string): Promise<boolean> {
  return parseMountTable(await readFile('/proc/self/mountinfo', 'utf8')).some((m) => m.mountPoint === dir);
}
