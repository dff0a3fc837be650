/**
 * Which files of a running desktop's writable layer may be copied ahead of its stop, and how the
 * pre-copy later tells whether one is still what was copied (transfer/precopy-source.ts).
 *
 * A file's identity is its inode number, size, ctime and mtime, in nanoseconds. The kernel sets
 * ctime on every change of a file's data or metadata (write, truncate, chmod, chown, xattr,
 * rename, link) and nothing inside a desktop can set it back: a file whose identity is the same
 * before it was read and at the desktop's stop held the same bytes and metadata all along.
 * Timestamps are coarse, though (a clock tick of up to 10 ms): a second write within the tick
 * of the first leaves ctime alone. So only *cold* files are picked, whose ctime is further in
 * the past than any tick: a write after the first look must then move it.
 *
 * Left out too: files with other names (a change through another link moves the shared ctime,
 * but the other name would travel in the unit as a link to a file left out of it), files any
 * process of the desktop maps shared and writable (stores into such a mapping reach the file
 * without a write, and mark it changed only when the page is first written after writeback),
 * small files (not worth a second request), and names tar would unquote (a newline or a
 * backslash): they go with the stopped desktop as before.
 */
import { link, lstat, mkdir, opendir, readFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { AgentFailure } from '../../../../../shared/src/protocol.js';
import type { FileIdentity, PrecopyEntry } from '../../transfer.js';

export interface ScanOptions {
  /** Files whose ctime is younger than this are left to the stop. */
  readonly coldMs: number;
  /** Files smaller than this are left to the stop. */
  readonly minBytes: number;
  /** What some process of the desktop maps shared and writable (`sharedWritableMaps`). */
  readonly mapped: SharedWritableMaps;
  /** Wall clock in ms (tests move it). */
  readonly now?: number;
  /** Names a scan looks at, at most (default MAX_VISITED; tests lower it). */
  readonly maxVisited?: number;
}

/** Bound a scan: past them, the rest of a desktop with millions of files is copied at its stop as before. */
const MAX_ENTRIES = 100_000;
const MAX_VISITED = 1_000_000;
/** Directory entries read at a time: a huge directory is read in steps, never listed whole. */
const DIR_BATCH = 512;
/** Names one directory may hold and still be scanned (sorted on the event loop: ≈0.05 s at this size). */
const MAX_DIR_NAMES = 100_000;

/**
 * The cold files worth sending ahead under `roots` (directories relative to `dir`: the writable
 * layer), in byte order of their names, the order tar would list them in.
 */
export async function scanCold(dir: string, roots: readonly string[], options: ScanOptions): Promise<PrecopyEntry[]> {
  const coldBefore = BigInt(Math.floor((options.now ?? Date.now()) - options.coldMs)) * 1_000_000n;
  const maxVisited = options.maxVisited ?? MAX_VISITED;
  const found: PrecopyEntry[] = [];
  let visited = 0;
  const walk = async (rel: string): Promise<void> => {
    const left = maxVisited - visited;
    const names = await namesUpTo(join(dir, rel), Math.min(left, MAX_DIR_NAMES));
    if (names === null) {
      // More names than the scan has left to look at, or than one directory may hold: the whole
      // directory goes with the stop, without listing (or sorting) all of it on the agent's one
      // thread; the scan ends when its budget is what ran out.
      if (left <= MAX_DIR_NAMES) visited = maxVisited;
      return;
    }
    for (const name of inByteOrder(names)) {
      if (found.length >= MAX_ENTRIES || ++visited > maxVisited) return;
      const path = `${rel}/${name}`;
      const st = await lstat(join(dir, path), { bigint: true }).catch(() => null);
      if (st === null) continue;
      if (st.isDirectory()) {
        await walk(path);
        continue;
      }
      if (!st.isFile() || st.nlink !== 1n || st.size < BigInt(options.minBytes) || st.ctimeNs >= coldBefore) continue;
      if (/[\n\\]/.test(path) || options.mapped.inodes.has(String(st.ino)) || options.mapped.paths.has(guestPath(path))) continue;
      found.push({ path, identity: identityOf(st) });
    }
  };
  for (const root of roots) await walk(root);
  return found;
}

/**
 * The names in `path`, read a batch at a time; null when there are more than `limit`. A directory
 * that is gone or unreadable has none: nothing of it is picked.
 */
async function namesUpTo(path: string, limit: number): Promise<string[] | null> {
  const names: string[] = [];
  let entries;
  try {
    entries = await opendir(path, { bufferSize: DIR_BATCH });
  } catch {
    return names;
  }
  try {
    // Leaving the loop early closes the directory.
    for await (const entry of entries) {
      if (names.length >= limit) return null;
      names.push(entry.name);
    }
  } catch {
    return []; // removed while it was read
  }
  return names;
}

/**
 * Each file's identity now (null when it is gone, no longer a lone regular file, or no longer
 * reached down plain directories: a guest that moved a directory and left a link to it in its
 * place keeps the file's identity, but the target, which unpacks the link, cannot put the file
 * under it, and would fail that import on every try).
 */
export async function identify(dir: string, paths: readonly string[]): Promise<Array<FileIdentity | null>> {
  return Promise.all(
    paths.map(async (path) => {
      if ((await plainPath(dir, path)) !== true) return null;
      const st = await lstat(join(dir, path), { bigint: true }).catch(() => null);
      return st !== null && st.isFile() && st.nlink === 1n ? identityOf(st) : null;
    }),
  );
}

export interface SharedWritableMaps {
  /** Inode numbers as the processes see them. */
  readonly inodes: ReadonlySet<string>;
  /** Paths as the guest sees them (`/root/…`). */
  readonly paths: ReadonlySet<string>;
}

/**
 * What `pids` map shared and writable (from `/proc/<pid>/maps`), by inode and by path: through an
 * overlay a copied-up file may show its lower file's inode number, so the path is checked too.
 */
export async function sharedWritableMaps(pids: readonly number[]): Promise<SharedWritableMaps> {
  const inodes = new Set<string>();
  const paths = new Set<string>();
  for (const pid of pids) {
    const maps = await readFile(`/proc/${pid}/maps`, 'utf8').catch(() => '');
    for (const line of maps.split('\n')) {
      // address perms offset dev inode [path]; perms like "rw-s"
      const m = /^\S+\s+(\S{4})\s+\S+\s+\S+\s+(\d+)\s*(.*)$/.exec(line);
      if (m === null || m[1]![1] !== 'w' || m[1]![3] !== 's' || m[2] === '0') continue;
      inodes.add(m[2]!);
      if (m[3]!.startsWith('/')) paths.add(m[3]!.replace(/ \(deleted\)$/, ''));
    }
  }
  return { inodes, paths };
}

/** Where the guest sees a member of its writable layer: `disk/root/x` and `upper/root/x` are `/root/x`. */
function guestPath(member: string): string {
  return member.slice(member.indexOf('/'));
}

/**
 * Puts the pre-copied `paths` (relative, under `preDir`) into `dest` as hard links, before the
 * rest of the unit is unpacked there: tar then creates the other files around them and sets the
 * directories' owners, modes, xattrs and mtimes last, as it does for any directory. The link
 * keeps the pre-copied inode (owner, mode, xattrs, mtime, holes); staging goes at the install,
 * which leaves the file with one name again. `runtime_error` (retryable) when one is missing.
 */
export async function linkPrecopied(preDir: string, dest: string, paths: readonly string[]): Promise<void> {
  for (const path of paths) {
    if (path.startsWith('/') || path.split('/').some((part) => part === '..' || part === '.' || part === '')) {
      throw new AgentFailure('runtime_error', `the source named a pre-copied file outside the desktop: ${JSON.stringify(path)}`, false);
    }
    await assertPlainPath(preDir, path);
    await mkdir(join(dest, dirname(path)), { recursive: true });
    try {
      await link(join(preDir, path), join(dest, path));
    } catch (err) {
      throw new AgentFailure('runtime_error', `a pre-copied file is missing here (${(err as NodeJS.ErrnoException).code ?? String(err)}); it is fetched whole on the next try`, true);
    }
  }
}

/**
 * Refuses a pre-copied path that is not plain directories down to a regular file: `link(2)`
 * follows symbolic links on the way, so a link the source's stream left in `pre/` would have
 * hard-linked a file of this host (anything on the state directory's filesystem) into the guest.
 */
async function assertPlainPath(preDir: string, path: string): Promise<void> {
  // Missing (null): the link below says so, retryably.
  if ((await plainPath(preDir, path)) === false) {
    throw new AgentFailure('runtime_error', `a pre-copied path is not plain directories to a file: ${JSON.stringify(path)}`, false);
  }
}

/** Whether `path` under `dir` leads down directories, none a symbolic link, to a regular file; null when a part is missing. */
async function plainPath(dir: string, path: string): Promise<boolean | null> {
  const parts = path.split('/');
  for (let i = 1; i <= parts.length; i++) {
    const st = await lstat(join(dir, ...parts.slice(0, i))).catch(() => null);
    if (st === null) return null;
    if (i === parts.length ? !st.isFile() : !st.isDirectory()) return false;
  }
  return true;
}

function identityOf(st: { ino: bigint; size: bigint; ctimeNs: bigint; mtimeNs: bigint }): FileIdentity {
  return { ino: String(st.ino), size: Number(st.size), ctimeNs: String(st.ctimeNs), mtimeNs: String(st.mtimeNs) };
}

/**
 * `names` sorted by their UTF-8 bytes, as tar lists them. UTF-8's byte order is code point order,
 * which JavaScript's own string order (UTF-16 code units) matches unless a name holds a character
 * past U+FFFF (a surrogate pair sorts below U+E000–U+FFFF in UTF-16, above in UTF-8); only then
 * are names compared as bytes, each encoded once. Encoding both names at each of the sort's
 * n log n comparisons held the agent's one thread for 0.6 s on a 100,000-name directory; the
 * string sort takes 0.05 s.
 */
export function inByteOrder(names: readonly string[]): string[] {
  if (!names.some((name) => SURROGATE.test(name))) return [...names].sort();
  const keyed = names.map((name) => ({ name, bytes: Buffer.from(name) }));
  keyed.sort((a, b) => Buffer.compare(a.bytes, b.bytes));
  return keyed.map((k) => k.name);
}

const SURROGATE = /[\uD800-\uDFFF]/;
