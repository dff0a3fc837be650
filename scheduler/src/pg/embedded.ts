/**
 * The embedded PostgreSQL of `canto up`: a private cluster inside the data directory, run from the
 * host's PostgreSQL binaries and reachable only through a unix socket in that directory
 * (`listen_addresses` is empty, so `trust` authentication never faces the network).
 *
 * PostgreSQL refuses to run as root, so when we are root the cluster belongs to the `postgres`
 * system user (created by Debian's package) and is started under that uid.
 */
import { spawn, execFileSync } from 'node:child_process';
import { existsSync, readdirSync, mkdirSync, chownSync, chmodSync, readFileSync, openSync, closeSync, statSync } from 'node:fs';
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
  stop(): Promise<void>;
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

export async function startEmbeddedPostgres(options: EmbeddedPostgresOptions): Promise<EmbeddedPostgres> {
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

  const logPath = join(options.dir, 'postgres.log');
  const logFd = openSync(logPath, 'a');
  if (ids) chownSync(logPath, ids.uid, ids.gid);
  const args = ['-D', dataDir, '-k', socketDir, '-c', 'listen_addresses=', '-c', 'max_connections=200'];
  if (options.fast) args.push('-c', 'fsync=off', '-c', 'synchronous_commit=off', '-c', 'full_page_writes=off');
  const child = spawn(join(bin, 'postgres'), args, { stdio: ['ignore', logFd, logFd], ...spawnIds });
  closeSync(logFd);

  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  const socket = join(socketDir, '.s.PGSQL.5432');
  const deadline = Date.now() + 30_000;
  for (;;) {
    if (existsSync(socket) && existsSync(join(dataDir, 'postmaster.pid'))) {
      const status = readFileSync(join(dataDir, 'postmaster.pid'), 'utf8').split('\n')[7]?.trim();
      if (status === 'ready') break;
    }
    if (child.exitCode !== null) throw new Error(`postgres exited with ${child.exitCode}; see ${logPath}`);
    if (Date.now() > deadline) throw new Error(`postgres did not become ready; see ${logPath}`);
    await new Promise((r) => setTimeout(r, 20));
  }

  const url = `postgres://canto@localhost/${database}?host=${encodeURIComponent(socketDir)}`;
  if (database !== 'postgres') await ensureDatabase(bin, socketDir, database, spawnIds);

  return {
    url,
    socketDir,
    async stop() {
      if (child.exitCode !== null) return;
      child.kill('SIGINT'); // fast shutdown
      const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
      await exited;
      clearTimeout(timer);
    },
  };
}

async function ensureDatabase(bin: string, socketDir: string, database: string, ids: object): Promise<void> {
  const psql = existsSync(join(bin, 'psql')) ? join(bin, 'psql') : 'psql';
  const exists = execFileSync(psql, ['-h', socketDir, '-U', 'canto', '-d', 'postgres', '-tAc', `SELECT 1 FROM pg_database WHERE datname = '${database.replace(/'/g, "''")}'`], { ...ids }).toString().trim();
  if (exists !== '1') {
    execFileSync(psql, ['-h', socketDir, '-U', 'canto', '-d', 'postgres', '-c', `CREATE DATABASE "${database.replace(/"/g, '""')}"`], { stdio: 'pipe', ...ids });
  }
}
