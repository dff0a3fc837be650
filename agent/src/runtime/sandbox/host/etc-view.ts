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
 * looks a name up in its top layer first, so a secret the host replaces by a rename stays hidden
 * (one it renames away, to a backup's name, is not: the mask knows names). The covers of
 * guest-init.ts stay on top, as before, and a snapshot that names them restores as before: they
 * now sit on the mask's dentries, which nothing renames.
 *
 * A mask is built once per set of secrets, in its own directory named by their hash, and never
 * changed afterwards: an overlay's layers must not change under it, and guests booted by an
 * earlier agent process keep theirs mounted. Views are mounted read-only (no upper layer) over
 * it. An overlay keeps the names it has looked up (ext4 does not ask it to revalidate them), so a
 * file of `/etc` the host replaces by a rename keeps its old content in a view that read it: a
 * fresh view is mounted every ETC_VIEW_REFRESH_MS for the guests booted from then on, and a guest
 * sees the host's `/etc` as it was at most that long before its boot or restore. Without overlay
 * support, or under a state directory whose path an overlay cannot name, the driver falls back to
 * the host's `/etc` and says so.
 */
import { createHash, randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { chmod, chown, lstat, mkdir, readFile, rename, rm, rmdir, writeFile } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { parseMountTable } from './mount-table.js';
import { runToEnd } from './spawner.js';

/** Where masks and views live under the driver's state directory. */
export const ETC_VIEW_DIR = 'etc-view';
/** Written once a mask is complete: only a complete mask is ever mounted. */
const READY = 'ready';

/** How often a fresh view is mounted for the guests booted from then on (see the module comment). */
export const ETC_VIEW_REFRESH_MS = 60_000;

type Log = (msg: string, fields?: object, level?: 'warn') => void;

/** Where a set of secrets' mask lives, and the views mounted over it. */
interface Layers {
  readonly mask: string;
  readonly views: string;
  readonly etc: string;
  /** The names the mask hides, absolute (under `etc`). */
  readonly files: readonly string[];
}

/** Every name a scan under this state directory found secret (see `withRemembered`). */
const REMEMBERED = 'names.json';
/** More names than this is not a host's `/etc`: the oldest are forgotten. */
const MAX_REMEMBERED = 10_000;

/**
 * Builds (or finds) the mask for `secretFiles` (absolute paths under `/etc`); null, having said
 * why, when no overlay can name it.
 */
async function prepareMask(stateDir: string, secretFiles: readonly string[], log: Log, etc: string): Promise<Layers | null> {
  const files = [...new Set(secretFiles)].filter((f) => f.startsWith(`${etc}/`) && !f.includes('/../')).sort();
  const key = createHash('sha256').update(JSON.stringify([etc, files])).digest('hex').slice(0, 16);
  const base = join(stateDir, ETC_VIEW_DIR, key);
  const mask = join(base, 'mask');
  // The overlay's option string separates layers with `:` and options with `,`.
  if (/[:,\\\s]/.test(mask) || /[:,\\\s]/.test(etc)) {
    log("the guests' /etc is the host's, with covers a rename on the host undoes: the state directory's path cannot name an overlay layer", { stateDir }, 'warn');
    return null;
  }
  if ((await readFile(join(base, READY), 'utf8').catch(() => null)) === null) await buildMask(mask, etc, files, join(base, READY));
  return { mask, views: join(base, 'views'), etc, files };
}

/**
 * `files` and the secrets earlier agents of this state directory found that the host no longer
 * has. A desktop booted with a secret covered keeps that cover in its memory snapshot, and a
 * restore mounts it on the name in the guest's `/etc`: were the name in neither the host's `/etc`
 * nor the mask, the restore would fail and the desktop boot cold. (A name the host has again, not
 * secret any more, is shown as the host has it.)
 */
async function withRemembered(stateDir: string, files: readonly string[], etc: string): Promise<string[]> {
  const record = join(stateDir, ETC_VIEW_DIR, REMEMBERED);
  // Unreadable or torn (a power loss before its data reached the disk): nothing remembered, and
  // written anew below, rather than the whole view turned off at every start.
  const read = await readFile(record, 'utf8').then((text) => JSON.parse(text) as unknown).catch(() => []);
  const remembered = (Array.isArray(read) ? read : []).filter((n): n is string => typeof n === 'string' && n.startsWith(`${etc}/`) && !n.includes('/../'));
  const known = new Set(remembered);
  // Newest last: the oldest names go first past the bound.
  const all = [...remembered.filter((n) => !files.includes(n)), ...new Set(files)].slice(-MAX_REMEMBERED);
  if (files.some((n) => !known.has(n)) || all.length !== remembered.length) {
    await mkdir(dirname(record), { recursive: true });
    const tmp = `${record}.${process.pid}.tmp`;
    await writeFile(tmp, JSON.stringify(all));
    await rename(tmp, record);
  }
  // Only where the mask can give the name the attributes of its host directory.
  const gone = remembered.filter((n) => !existsSync(n) && existsSync(dirname(n)));
  return [...new Set([...files, ...gone])];
}

/** Mounts a view of its own over the mask; answers its path. */
async function mountView(layers: Layers): Promise<string> {
  const view = join(layers.views, `${Date.now()}-${randomBytes(4).toString('hex')}`);
  await mkdir(view, { recursive: true, mode: 0o755 });
  const mounted = await runToEnd('mount', ['-t', 'overlay', 'canto-etc', '-o', `ro,lowerdir=${layers.mask}:${layers.etc}`, view], { timeoutMs: 10_000 });
  if (mounted.code !== 0) {
    await rmdir(view).catch(() => undefined);
    throw new Error(`mount exited with ${String(mounted.code)}: ${mounted.stderr.trim()}`);
  }
  return view;
}

/** Unmounts a view (the guests that bound it keep their binds) and removes its directory; best effort. */
async function dropView(view: string): Promise<void> {
  await runToEnd('umount', ['-l', view], { timeoutMs: 10_000 }).catch(() => undefined);
  await rmdir(view).catch(() => undefined);
}

/** The views an earlier agent process left mounted under the state directory (it was killed). */
async function leftViews(stateDir: string): Promise<string[]> {
  const prefix = `${join(resolve(stateDir), ETC_VIEW_DIR)}/`;
  return parseMountTable(await readFile('/proc/self/mountinfo', 'utf8')).map((m) => m.mountPoint).filter((p) => p.startsWith(prefix));
}

/**
 * The view each driver's guests get, by the driver's state directory, and how many drivers of
 * this process use it (a test, or a cleanup, may open a second one on the same directory).
 */
interface Held {
  /** The view new guests bind. */
  view: string;
  /** The one before: still mounted for a restore that was handed it just before the refresh. */
  previous: string | null;
  refs: number;
  readonly layers: Layers;
  readonly log: Log;
  warned: boolean;
  readonly timer: NodeJS.Timeout;
}

const views = new Map<string, Held>();

/**
 * Mounts the view for the driver at `stateDir` and gives it to the guests it boots, a fresh one
 * every ETC_VIEW_REFRESH_MS; answers it, or null where its guests get the host's `/etc`.
 */
export async function acquireEtcView(stateDir: string, secretFiles: readonly string[], log: Log, etc = '/etc'): Promise<string | null> {
  const key = resolve(stateDir);
  const held = views.get(key);
  if (held !== undefined) {
    held.refs++;
    return held.view;
  }
  try {
    for (const left of await leftViews(stateDir)) await dropView(left);
    const layers = await prepareMask(stateDir, await withRemembered(stateDir, secretFiles, etc), log, etc);
    if (layers === null) return null;
    const view = await mountView(layers);
    const timer = setInterval(() => void refreshEtcView(stateDir), ETC_VIEW_REFRESH_MS);
    timer.unref();
    views.set(key, { view, previous: null, refs: 1, layers, log, warned: false, timer });
    return view;
  } catch (err) {
    log("the guests' /etc is the host's, with covers a rename on the host undoes: its view could not be mounted", { stateDir, error: String(err) }, 'warn');
    return null;
  }
}

/**
 * Mounts a fresh view for the guests booted from now on. An overlay keeps the names it has looked
 * up, so a file of `/etc` the host replaced by a rename shows its old content through a view that
 * had read it before; a fresh view reads it anew. The view before the last is unmounted.
 */
export async function refreshEtcView(stateDir: string): Promise<void> {
  const held = views.get(resolve(stateDir));
  if (held === undefined) return;
  let fresh: string;
  try {
    fresh = await mountView(held.layers);
  } catch (err) {
    held.log('could not mount a fresh view of /etc for new desktops; they get the current one', { error: String(err) }, 'warn');
    return;
  }
  // Released meanwhile: nothing uses it.
  if (views.get(resolve(stateDir)) !== held) return dropView(fresh);
  const older = held.previous;
  held.previous = held.view;
  held.view = fresh;
  if (older !== null) await dropView(older);
}

/**
 * A driver that acquired the view closes: the last one of this process unmounts it (its guests
 * keep theirs: each holds a bind of its own, and the next agent mounts one again).
 */
export async function releaseEtcView(stateDir: string): Promise<void> {
  const key = resolve(stateDir);
  const held = views.get(key);
  if (held === undefined || --held.refs > 0) return;
  views.delete(key);
  clearInterval(held.timer);
  for (const view of [held.view, held.previous]) if (view !== null) await dropView(view);
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
 * The names of the host's `/etc` that a desktop under `desktopDir` restored now finds hidden by
 * its view, whatever covers its snapshot holds; none where it gets the host's `/etc`.
 */
export function etcHiddenFor(desktopDir: string): readonly string[] {
  const held = views.get(dirname(dirname(desktopDir)));
  if (held === undefined || etcSourceFor(desktopDir) !== held.view) return [];
  return held.layers.files;
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
