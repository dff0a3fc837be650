/**
 * The embedded PostgreSQL of `canto up`: a private cluster inside the data directory, run from the
 * host's PostgreSQL binaries and reachable only through a unix socket in that directory
 * (`listen_addresses` is empty, so `trust` authentication never faces the network).
 *
 * PostgreSQL refuses to run as root, so when we are root the cluster belongs to the `postgres`
 * system user (created by Debian's package) and is started under that uid.
 *
 * After a crash (`kill -9` of whoever started it) the cluster's postmaster may still run,
 * orphaned, or be gone with its pid file left behind. A start looks at the pid file first: a live
 * postmaster of this very data directory (its working directory says so) is shut down (fast
 * shutdown, then harder), a stale file naming another process is removed, and only then is a new
 * postmaster started. It counts as up only once the pid file names that new process as `ready`
 * and a connection is accepted: never a silent reuse of someone else's server, never two. The
 * caller (canto up) holds the data directory's lock, so the server it stops is no one's.
 */
import { spawn, execFileSync } from 'node:child_process';
import { existsSync, readdirSync, mkdirSync, chownSync, chmodSync, readFileSync, openSync, closeSync, statSync, readlinkSync, realpathSync, rmSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';

export interface EmbeddedPostgresOptions {
  /** Directory holding `data/` (the cluster), `run/` (the socket) and `postgres.log`. */
  readonly dir: string;
  readonly database?: string;
  /** Skip fsync: for throwaway test clusters only. */
  readonly fast?: boolean;
}

export interface EmbeddedPostgres {
  /** A `postgres://` URL with `?host=<socket dir>`, understood by `connectDatabase`. */
  readonly url: string;
  readonly socketDir: string;
  /** The postmaster's pid. */
  readonly pid: number;
  stop(): Promise<void>;
}

/** The pid file's fields: pid (line 1) and status (line 8: `starting`, `ready`, `stopping`). */
function readPidFile(dataDir: string): { pid: number; status: string } | null {
  let text: string;
  try {
    text = readFileSync(join(dataDir, 'postmaster.pid'), 'utf8');
  } catch {
    return null;
  }
  const lines = text.split('\n');
  const pid = Number(lines[0]);
  return Number.isInteger(pid) && pid > 0 ? { pid, status: lines[7]?.trim() ?? '' } : null;
}

function lockPid(path: string): number | null {
  try {
    const pid = Number(readFileSync(path, 'utf8').split('\n')[0]);
    return Number.isInteger(pid) && pid > 0 ? pid : null;
  } catch {
    return null;
  }
}

/** True when `pid` is a PostgreSQL process working in `dataDir` (postgres chdirs into it). */
function isClusterProcess(pid: number, dataDir: string): boolean {
  try {
    const comm = readFileSync(`/proc/${pid}/comm`, 'utf8').trim();
    return comm === 'postgres' && readlinkSync(`/proc/${pid}/cwd`) === realpathSync(dataDir);
  } catch {
    return false;
  }
}

/** The postmaster running this cluster now, or null (no pid file, or a stale one). */
export function runningPostmaster(dataDir: string): number | null {
  const file = readPidFile(dataDir);
  return file !== null && isClusterProcess(file.pid, dataDir) ? file.pid : null;
}

/** Every process of this cluster: the postmaster and its backends, by their working directory. */
function clusterProcesses(dataDir: string): number[] {
  return readdirSync('/proc')
    .filter((name) => /^\d+$/.test(name))
    .map(Number)
    .filter((pid) => isClusterProcess(pid, dataDir));
}

async function waitGone(pids: readonly number[], timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (pids.every((pid) => !existsSync(`/proc/${pid}`) || readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.startsWith('Z'))) return true;
    if (Date.now() > deadline) return false;
    await new Promise((r) => setTimeout(r, 25));
  }
}

/**
 * Stops a leftover postmaster of this data directory: fast shutdown (SIGINT: sessions end,
 * nothing committed is lost), then immediate shutdown (SIGQUIT), then SIGKILL of the postmaster
 * and its backends. Returns when none of them runs.
 */
async function stopLeftover(pid: number, dataDir: string, log: (msg: string) => void): Promise<void> {
  log(`stopping a PostgreSQL server left running on ${dataDir} (pid ${pid})`);
  for (const [signal, waitMs] of [['SIGINT', 15_000], ['SIGQUIT', 5_000]] as const) {
    try {
      process.kill(pid, signal);
    } catch {
      break;
    }
    if (await waitGone([pid], waitMs)) break;
  }
  const rest = clusterProcesses(dataDir);
  for (const p of rest) {
    try {
      process.kill(p, 'SIGKILL');
    } catch {
      // Gone meanwhile.
    }
  }
  if (!(await waitGone(rest, 5_000))) throw new Error(`PostgreSQL processes of ${dataDir} do not exit (pids ${rest.join(', ')})`);
}

/** Finds the directory holding `initdb` and `postgres`: PATH first, then Debian's versioned dirs. */
export function findPostgresBinDir(): string {
  const fromPath = (process.env.PATH ?? '').split(':').find((d) => d && existsSync(join(d, 'initdb')) && existsSync(join(d, 'postgres')));
  if (fromPath) return fromPath;
  const root = '/usr/lib/postgresql';
  if (existsSync(root)) {
    const versions = readdirSync(root)
      .filter((v) => existsSync(join(root, v, 'bin', 'initdb')))
      .sort((a, b) => Number(b) - Number(a));
    if (versions[0]) return join(root, versions[0], 'bin');
  }
  throw new Error('PostgreSQL server binaries (initdb, postgres) not found; run scripts/setup');
}

function runAsIds(): { uid: number; gid: number } | null {
  if (process.getuid?.() !== 0) return null;
  const line = readFileSync('/etc/passwd', 'utf8').split('\n').find((l) => l.startsWith('postgres:'));
  if (!line) throw new Error('running as root needs the "postgres" system user for the embedded database');
  const [, , uid, gid] = line.split(':');
  return { uid: Number(uid), gid: Number(gid) };
}

/** Every ancestor must let other users search it, or the `postgres` user cannot reach the cluster. */
function assertTraversable(dir: string): void {
  for (let d = dir; ; d = dirname(d)) {
    if ((statSync(d).mode & 0o001) === 0) {
      throw new Error(`the embedded database needs ${d} to be searchable by the postgres user (chmod o+x ${d})`);
    }
    if (d === dirname(d)) return;
  }
}

function ownedDir(path: string, ids: { uid: number; gid: number } | null, mode: number): void {
  mkdirSync(path, { recursive: true });
  if (ids) chownSync(path, ids.uid, ids.gid);
  chmodSync(path, mode);
}

export async function startEmbeddedPostgres(options: EmbeddedPostgresOptions & { log?: (msg: string) => void }): Promise<EmbeddedPostgres> {
  const bin = findPostgresBinDir();
  const ids = runAsIds();
  const database = options.database ?? 'canto';
  const dataDir = join(options.dir, 'data');
  const socketDir = join(options.dir, 'run');
  mkdirSync(options.dir, { recursive: true });
  // The postgres user must traverse into the directory; it holds nothing secret besides the
  // cluster, which keeps its own 0700 mode.
  if (ids) {
    chmodSync(options.dir, 0o711);
    assertTraversable(dirname(resolve(options.dir)));
  }
  ownedDir(socketDir, ids, 0o700);
  const spawnIds = ids ?? {};

  if (!existsSync(join(dataDir, 'PG_VERSION'))) {
    ownedDir(dataDir, ids, 0o700);
    try {
      execFileSync(
        join(bin, 'initdb'),
        ['-D', dataDir, '-U', 'canto', '-A', 'trust', '-E', 'UTF8', '--locale=C', ...(options.fast ? ['--no-sync'] : [])],
        { stdio: 'pipe', ...spawnIds },
      );
    } catch (err) {
      const stderr = (err as { stderr?: Buffer }).stderr?.toString().trim();
      throw new Error(`initdb failed: ${stderr || (err as Error).message}`);
    }
  }

  const leftover = runningPostmaster(dataDir);
  if (leftover !== null) {
    await stopLeftover(leftover, dataDir, options.log ?? (() => {}));
  } else {
    // Backends whose postmaster was killed would keep the shared memory PostgreSQL refuses to reuse.
    const strays = clusterProcesses(dataDir);
    if (strays.length > 0) await stopLeftover(strays[0]!, dataDir, options.log ?? (() => {}));
  }
  // Lock files naming a process that is not this cluster's (dead, a zombie not yet reaped, or the
  // pid reused since): PostgreSQL refuses to start while that pid exists at all.
  for (const lock of [join(dataDir, 'postmaster.pid'), join(socketDir, '.s.PGSQL.5432.lock')]) {
    const pid = lockPid(lock);
    if (pid !== null && !isClusterProcess(pid, dataDir)) rmSync(lock, { force: true });
  }

  const logPath = join(options.dir, 'postgres.log');
  const logFd = openSync(logPath, 'a');
  if (ids) chownSync(logPath, ids.uid, ids.gid);
  const args = ['-D', dataDir, '-k', socketDir, '-c', 'listen_addresses=', '-c', 'max_connections=200'];
  if (options.fast) args.push('-c', 'fsync=off', '-c', 'synchronous_commit=off', '-c', 'full_page_writes=off');
  // Its own process group: a Ctrl-C at the terminal reaches the process that started it, which
  // stops it last (canto up still needs it to hibernate the desktops), not the server directly.
  const child = spawn(join(bin, 'postgres'), args, { stdio: ['ignore', logFd, logFd], detached: true, ...spawnIds });
  closeSync(logFd);

  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  const stop = async () => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    child.kill('SIGINT'); // fast shutdown
    const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
    await exited;
    clearTimeout(timer);
  };
  const url = `postgres://canto@localhost/${database}?host=${encodeURIComponent(socketDir)}`;
  try {
    const deadline = Date.now() + 60_000;
    // Ready means: the pid file names this child (not a leftover's), and says so.
    for (;;) {
      const file = readPidFile(dataDir);
      if (file !== null && file.pid === child.pid && file.status === 'ready' && existsSync(join(socketDir, '.s.PGSQL.5432'))) break;
      if (child.exitCode !== null || child.signalCode !== null) throw new Error(`postgres exited with ${child.exitCode ?? child.signalCode}; see ${logPath}`);
      if (Date.now() > deadline) throw new Error(`postgres did not become ready; see ${logPath}`);
      await new Promise((r) => setTimeout(r, 20));
    }
    if (database !== 'postgres') await ensureDatabase(bin, socketDir, database, spawnIds);
  } catch (err) {
    await stop();
    throw err;
  }

  return { url, socketDir, pid: child.pid!, stop };
}

async function ensureDatabase(bin: string, socketDir: string, database: string, ids: object): Promise<void> {
  const psql = existsSync(join(bin, 'psql')) ? join(bin, 'psql') : 'psql';
  const exists = execFileSync(psql, ['-h', socketDir, '-U', 'canto', '-d', 'postgres', '-tAc', `SELECT 1 FROM pg_database WHERE datname = '${database.replace(/'/g, "''")}'`], { ...ids }).toString().trim();
  if (exists !== '1') {
    execFileSync(psql, ['-h', socketDir, '-U', 'canto', '-d', 'postgres', '-c', `CREATE DATABASE "${database.replace(/"/g, '""')}"`], { stdio: 'pipe', ...ids });
  }
}
