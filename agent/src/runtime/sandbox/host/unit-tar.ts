/**
 * A transfer unit as a tar stream (agent/src/runtime/transfer.ts), made by GNU tar so that the
 * same tree gives the same bytes every time and the tree comes back exactly on the other host.
 *
 * Deterministic: members sorted by name in byte order (`--sort=name`, `LC_ALL=C`), numeric owners
 * only, pax headers named without the producing pid (`exthdr.name`) and without atime and ctime
 * (both change by merely reading or linking a file). Sparse files use the pax sparse format 0.0:
 * the newer 1.0 names each sparse member `GNUSparseFile.<pid>/…` in its ustar header, so two runs
 * differ. Nothing else in a posix archive depends on the moment or the process: an unchanged tree
 * gives the same stream, which is what lets a broken copy resume at a byte offset.
 *
 * Faithful: hard links stay links (within the unit), holes stay holes, symlinks, modes, owners,
 * mtimes and every xattr namespace travel, `trusted.*` included; overlayfs marks deleted lower
 * files with 0:0 character devices and opaque directories with `trusted.overlay.opaque`, and both
 * must survive or a fork's deletions come back. Sockets are skipped (a listening socket's file
 * means nothing without its process; CRIU binds it again on restore).
 *
 * Records are 64 KiB (`-b 128`) instead of tar's 10 KiB, the size of a pipe's buffer: tar then
 * writes a pipe-full at a time, which more than doubles the throughput of a stream here.
 */
import type { Writable } from 'node:stream';
import { spawnProcess, type SpawnedProcess } from './spawner.js';
import { SlabReader } from '../../slabs.js';
import type { ReadOptions, UnitSink, UnitStream } from '../../transfer.js';

const RECORD_BLOCKS = '128';

const COMMON = ['-b', RECORD_BLOCKS, '--numeric-owner', '--xattrs', '--xattrs-include=*'];

/** Flags of `tar --create` (besides where it reads); exported for the tests' sake. */
export const CREATE_FLAGS = [
  ...COMMON,
  '--format=posix',
  '--sort=name',
  '--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime',
  '--sparse',
  '--sparse-version=0.0',
  '--warning=no-file-ignored',
];

const EXTRACT_FLAGS = [...COMMON, '--read-full-records', '--preserve-permissions', '--same-owner'];

const TAR_ENV = { LC_ALL: 'C', PATH: '/usr/sbin:/usr/bin:/sbin:/bin' };
/**
 * GNU tar's warning for an extended attribute it could not set, after which it still exits 0.
 * Such a copy is not the desktop: overlayfs keeps whiteouts and opaque directories in `trusted.*`
 * attributes (a lost one brings deleted files back), and file capabilities live in `security.*`.
 */
const XATTR_FAILED = /Cannot set '[^\n]{0,300}?' extended attribute for file [^\n]{0,200}/;
/** Characters of tar's stderr carried over to the next chunk, so a warning cut in two is still found. */
const XATTR_CARRY = 600;
/** Bytes of tar's stderr kept for an error message. */
const STDERR_KEEP = 2000;

/**
 * Files under the members that a stream leaves out (pre-copied ones, transfer/precopy-source.ts):
 * exact member names, matched whole (`--anchored`) and literally (`--no-wildcards`), read from
 * tar's stdin so that no list is too long for a command line. Names with a newline or a
 * backslash are never left out (precopy-files.ts does not pick them), as tar would unquote them.
 */
function excludeArgs(leaveOut: readonly string[]): string[] {
  return leaveOut.length === 0 ? [] : ['--anchored', '--no-wildcards', '--exclude-from=-'];
}

function feed(stdin: Writable, leaveOut: readonly string[]): void {
  stdin.on('error', () => undefined);
  stdin.end(leaveOut.map((name) => `${name}\n`).join(''));
}

/**
 * The tar stream of `members` (paths relative to `dir`, given in byte order) less the files in
 * `leaveOut`: tar's own stdout, with no stream in between (this is the hot path of a move), and
 * `done`, which says whether tar exited 0. Destroying the body kills tar.
 */
export async function tarStream(dir: string, members: readonly string[], leaveOut: readonly string[] = [], how: ReadOptions = {}): Promise<UnitStream> {
  const reader = how.slabs === true ? new SlabReader() : null;
  const child = await spawnProcess('tar', ['--create', '--file=-', ...CREATE_FLAGS, ...excludeArgs(leaveOut), '-C', dir, '--', ...members], {
    env: TAR_ENV,
    stdio: ['pipe', 'pipe', 'pipe'],
    ...(reader === null ? {} : { stdoutOnread: reader.onread }),
  });
  feed(child.stdin!, leaveOut);
  return produced(child, 'tar --create', false, reader);
}

/** Where a confined tar sees the desktop's directory. */
const CONFINED_DIR = '/desktop';

/**
 * `tar args` in a mount namespace whose root holds only the host's `/usr` (read-only: tar and its
 * libraries, which every guest sees anyway) and the desktop's directory `dir` (read-only, at
 * CONFINED_DIR). Paths a running guest can change under the reader resolve inside that root: a
 * directory swapped for a symlink to `/etc` between the pre-copy's scan and its read names a
 * path that does not exist there, never the host's file, which the agent as the host's root
 * would otherwise have read and sent into the desktop.
 */
function confinedTar(bwrap: string, dir: string, args: readonly string[]): [string, string[]] {
  return [bwrap, [
    '--die-with-parent', '--ro-bind', '/usr', '/usr',
    '--symlink', 'usr/lib', '/lib', '--symlink', 'usr/lib64', '/lib64', '--symlink', 'usr/bin', '/bin',
    '--ro-bind', dir, CONFINED_DIR, '--chdir', CONFINED_DIR,
    '--', '/usr/bin/tar', ...args,
  ]];
}

/**
 * A tar stream of exactly the regular files `files` (paths relative to `dir`, no directories),
 * in the unit format, for a pre-copy while the desktop runs. Files change and vanish meanwhile:
 * tar then stores what it could (it never writes more of a file than the size it first saw) and
 * exits 1, which is not a failure here; the pre-copy compares every file's identity afterwards
 * and keeps only those unchanged. The guest runs meanwhile, so tar reads confined (confinedTar).
 */
export async function fileListStream(dir: string, files: readonly string[], how: ReadOptions = {}, bwrap = 'bwrap'): Promise<UnitStream> {
  const reader = how.slabs === true ? new SlabReader() : null;
  const [program, argv] = confinedTar(bwrap, dir, [
    '--create', '--file=-', ...CREATE_FLAGS, '--ignore-failed-read', '--warning=no-file-changed', '--warning=no-file-removed', '--no-recursion',
    '-C', CONFINED_DIR, '--null', '--verbatim-files-from', '--files-from=-',
  ]);
  const child = await spawnProcess(program, argv, { env: TAR_ENV, stdio: ['pipe', 'pipe', 'pipe'], ...(reader === null ? {} : { stdoutOnread: reader.onread }) });
  child.stdin!.on('error', () => undefined);
  child.stdin!.end(files.map((name) => `${name}\0`).join(''));
  return produced(child, 'tar --create', true, reader);
}

/** The stream of a `tar --create`; in slabs when they were asked for and the child reads that way. */
function produced(child: SpawnedProcess, what: string, changesAllowed: boolean, reader: SlabReader | null): UnitStream {
  const body = child.stdout!;
  let stderr = '';
  child.stderr!.on('data', (chunk: Buffer) => {
    stderr = (stderr + chunk.toString('utf8')).slice(-STDERR_KEEP);
  });
  const done = new Promise<void>((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (code: number | null, signal: NodeJS.Signals | null) => {
      if (code === 0 || (changesAllowed && code === 1)) resolve();
      else reject(new Error(`${what} failed (${code ?? signal}): ${lastLine(stderr)}`));
    });
  });
  done.catch(() => undefined);
  // Destroyed by its reader before the end: nobody wants the rest.
  body.once('close', () => {
    if (!body.readableEnded && child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  });
  return { body, done, ...(reader !== null && child.stdoutOnread === true ? { slabs: reader } : {}) };
}

/**
 * The exact length of `tarStream(dir, members)`, without reading file data: GNU tar writing to
 * /dev/null only walks the tree (it still finds the holes of sparse files, which shape the
 * headers) and `--totals` reports the archive's size. Measured at a few milliseconds for a tree
 * whose stream takes hundreds, so a move's listing no longer reads every byte before the copy.
 */
export async function tarSize(dir: string, members: readonly string[], leaveOut: readonly string[] = []): Promise<number> {
  const child = await spawnProcess('tar', ['--create', '--file=/dev/null', '--totals', ...CREATE_FLAGS, ...excludeArgs(leaveOut), '-C', dir, '--', ...members], {
    env: TAR_ENV,
    stdio: ['pipe', 'ignore', 'pipe'],
  });
  feed(child.stdin!, leaveOut);
  return new Promise((resolve, reject) => {
    let stderr = '';
    child.stderr!.on('data', (chunk: Buffer) => {
      stderr = (stderr + chunk.toString('utf8')).slice(-STDERR_KEEP);
    });
    child.once('error', reject);
    child.once('close', (code: number | null, signal: NodeJS.Signals | null) => {
      const total = /Total bytes written: (\d+)/.exec(stderr)?.[1];
      if (code === 0 && total !== undefined) resolve(Number(total));
      else reject(new Error(`tar --totals failed (${code ?? signal}): ${lastLine(stderr)}`));
    });
  });
}

/**
 * Extracts a tar stream written to the sink's input into `dir` (which must exist). Writes go
 * straight into tar's stdin, with no stream in between: this is the hot path of an import.
 */
export async function untar(dir: string): Promise<UnitSink> {
  const child = await spawnProcess('tar', ['--extract', '--file=-', ...EXTRACT_FLAGS, '-C', dir], {
    env: TAR_ENV,
    stdio: ['pipe', 'ignore', 'pipe'],
  });
  const input = child.stdin!;
  let stderr = '';
  let lostXattr: string | null = null;
  child.stderr!.on('data', (chunk: Buffer) => {
    const text = chunk.toString('utf8');
    // Looked for in the new text with the end of the old, before the kept window is cut: a long
    // run of other warnings (timestamps in the future) must not push one out unseen.
    lostXattr ??= XATTR_FAILED.exec(stderr.slice(-XATTR_CARRY) + text)?.[0] ?? null;
    stderr = (stderr + text).slice(-STDERR_KEEP);
  });
  let aborted = false;
  // A write after tar stopped reading fails with EPIPE; what matters is why tar stopped, below.
  input.on('error', () => undefined);
  const done = new Promise<void>((resolve, reject) => {
    child.once('error', reject);
    child.once('close', (code: number | null, signal: NodeJS.Signals | null) => {
      if (code === 0 && !aborted && lostXattr === null) resolve();
      else if (code === 0 && !aborted) reject(new Error(`tar --extract could not keep an extended attribute: ${lostXattr}`));
      else reject(new Error(aborted ? 'the unpacking was abandoned' : `tar --extract failed (${code ?? signal}): ${lastLine(stderr)}`));
    });
  });
  done.catch(() => undefined);
  return {
    input,
    done,
    abort() {
      aborted = true;
      child.kill('SIGKILL');
    },
  };
}

function lastLine(text: string): string {
  return text.trim().split('\n').slice(-2).join(' | ');
}
