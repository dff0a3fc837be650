/**
 * The data directory of `canto up`: the embedded PostgreSQL cluster, the agent's state, the
 * deployment's generated secrets (`secrets.json`, mode 0600: the key sealing desktop env and
 * setup scripts, the local agent's join token and the admin API token) and where the running
 * `canto up` serves its API (`up.json`, for the admin commands of the CLI).
 */
import { existsSync, mkdirSync, readFileSync, renameSync, writeFileSync, chmodSync, unlinkSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { generateSecretKey } from '../../scheduler/src/crypto/secret-box.js';
import { runningPostmaster, startEmbeddedPostgres, type EmbeddedPostgres } from '../../scheduler/src/pg/embedded.js';

export const DEFAULT_DATA_DIR = '/var/lib/canto';

export interface DataDirSecrets {
  secret_key: string;
  join_token: string;
  /** The admin API's token (CANTO_ADMIN_TOKEN); added to a data directory made before it existed. */
  admin_token: string;
}

const SECRETS_FILE = 'secrets.json';
const UP_FILE = 'up.json';

/** Creates the data directory; the embedded cluster's `postgres` user must be able to traverse it. */
export function ensureDataDir(dataDir: string): void {
  mkdirSync(dataDir, { recursive: true });
  if (process.getuid?.() === 0) chmodSync(dataDir, 0o711);
}

export function loadOrCreateSecrets(dataDir: string): DataDirSecrets {
  ensureDataDir(dataDir);
  const path = join(dataDir, SECRETS_FILE);
  const token = () => randomBytes(32).toString('base64url');
  if (existsSync(path)) {
    const found = JSON.parse(readFileSync(path, 'utf8')) as Partial<DataDirSecrets> & Pick<DataDirSecrets, 'secret_key' | 'join_token'>;
    if (found.admin_token) return found as DataDirSecrets;
    // Written whole and renamed into place: a crash leaves the old file or the new one, never half.
    const upgraded: DataDirSecrets = { ...found, admin_token: token() };
    writeFileSync(`${path}.tmp`, JSON.stringify(upgraded, null, 2) + '\n', { mode: 0o600 });
    chmodSync(`${path}.tmp`, 0o600);
    renameSync(`${path}.tmp`, path);
    return upgraded;
  }
  const secrets: DataDirSecrets = { secret_key: generateSecretKey(), join_token: token(), admin_token: token() };
  writeFileSync(path, JSON.stringify(secrets, null, 2) + '\n', { mode: 0o600, flag: 'wx' });
  chmodSync(path, 0o600);
  return secrets;
}

/** The admin token of a data directory, for the CLI's admin commands; the error names the file, never its content. */
export function readAdminToken(dataDir: string): string {
  const path = join(dataDir, SECRETS_FILE);
  let secrets: Partial<DataDirSecrets>;
  try {
    secrets = JSON.parse(readFileSync(path, 'utf8')) as Partial<DataDirSecrets>;
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    throw new Error(`cannot read the admin token from ${path}: ${code ?? 'not JSON'}${code === 'EACCES' ? ' (run as the user that runs canto up, or set CANTO_ADMIN_TOKEN)' : ''}`);
  }
  if (!secrets.admin_token) throw new Error(`${path} has no admin token yet: start canto up once with this version, or set CANTO_ADMIN_TOKEN`);
  return secrets.admin_token;
}

/** Records where the running `canto up` serves its API. */
export function recordApiUrl(dataDir: string, url: string): void {
  writeFileSync(join(dataDir, UP_FILE), JSON.stringify({ api_url: url }) + '\n', { mode: 0o644 });
}

/** Where the last `canto up` of the data directory served its API; null when none recorded it. */
export function recordedApiUrl(dataDir: string): string | null {
  try {
    const recorded = JSON.parse(readFileSync(join(dataDir, UP_FILE), 'utf8')) as { api_url?: unknown };
    return typeof recorded.api_url === 'string' ? recorded.api_url : null;
  } catch {
    return null;
  }
}

/**
 * The data directory's database: a running cluster (that of a running `canto up`) is reused
 * through its socket; otherwise the cluster is started for as long as the caller needs it. One
 * that was never made is an error: a reader such as `canto status` pointed at the wrong place
 * must not make an empty database and report a fleet with nothing in it.
 */
export async function openDataDirDatabase(dataDir: string): Promise<{ url: string; stop(): Promise<void> }> {
  const dir = join(dataDir, 'postgres');
  const socketDir = join(dir, 'run');
  if (existsSync(join(dir, 'data')) && runningPostmaster(join(dir, 'data')) !== null) {
    return { url: `postgres://canto@localhost/canto?host=${encodeURIComponent(socketDir)}`, stop: async () => {} };
  }
  if (!existsSync(join(dir, 'data', 'PG_VERSION'))) {
    throw new Error(`${dataDir} holds no database of canto up: give the scheduler's database with --database-url (or DATABASE_URL), or the --data-dir of a canto up`);
  }
  ensureDataDir(dataDir);
  const pg: EmbeddedPostgres = await startEmbeddedPostgres({ dir });
  return { url: pg.url, stop: () => pg.stop() };
}

export const LOCK_FILE = 'canto-up.pid';

/** The start time of a live process (a zombie is not), or null: it tells a reused pid apart. */
function processStart(pid: number): string | null {
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const rest = fields.slice(fields.lastIndexOf(')') + 2).split(' ');
    return rest[0] === 'Z' || rest[0] === 'X' ? null : (rest[19] ?? null);
  } catch {
    return null;
  }
}

/**
 * Takes the data directory for this process: one `canto up` per directory. The lock file names
 * the holder by pid and start time; a holder that no longer runs (killed, crashed) left a stale
 * lock, which is taken over.
 */
export function lockDataDir(dataDir: string): { release(): void } {
  ensureDataDir(dataDir);
  const path = join(dataDir, LOCK_FILE);
  const mine = `${process.pid} ${processStart(process.pid)}\n`;
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      writeFileSync(path, mine, { flag: 'wx', mode: 0o644 });
      return {
        release() {
          try {
            if (readFileSync(path, 'utf8') === mine) unlinkSync(path);
          } catch {
            // Already gone.
          }
        },
      };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
    const [pid, start] = readFileSync(path, 'utf8').trim().split(' ');
    if (pid && Number(pid) !== process.pid && start && processStart(Number(pid)) === start) {
      throw new Error(`canto up is already running on ${dataDir} (pid ${pid}); stop it first`);
    }
    unlinkSync(path); // stale: its process is gone
  }
  throw new Error(`could not take ${path}; another canto up is starting on ${dataDir}`);
}
