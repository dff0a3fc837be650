/**
 * The data directory of `canto up`: the embedded PostgreSQL cluster, the agent's state and the
 * deployment's generated secrets (`secrets.json`, mode 0600: the key sealing desktop env and
 * setup scripts, and the local agent's join token).
 */
import { existsSync, mkdirSync, readFileSync, writeFileSync, chmodSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { generateSecretKey } from '../../scheduler/src/crypto/secret-box.js';
import { runningPostmaster, startEmbeddedPostgres, type EmbeddedPostgres } from '../../scheduler/src/pg/embedded.js';

export const DEFAULT_DATA_DIR = '/var/lib/canto';

export interface DataDirSecrets {
  secret_key: string;
  join_token: string;
}

/** Creates the data directory; the embedded cluster's `postgres` user must be able to traverse it. */
export function ensureDataDir(dataDir: string): void {
  mkdirSync(dataDir, { recursive: true });
  if (process.getuid?.() === 0) chmodSync(dataDir, 0o711);
}

export function loadOrCreateSecrets(dataDir: string): DataDirSecrets {
  ensureDataDir(dataDir);
  const path = join(dataDir, 'secrets.json');
  if (existsSync(path)) return JSON.parse(readFileSync(path, 'utf8')) as DataDirSecrets;
  const secrets: DataDirSecrets = { secret_key: generateSecretKey(), join_token: randomBytes(32).toString('base64url') };
  writeFileSync(path, JSON.stringify(secrets, null, 2) + '\n', { mode: 0o600, flag: 'wx' });
  chmodSync(path, 0o600);
  return secrets;
}

/**
 * The data directory's database: a running cluster (that of a running `canto up`) is reused
 * through its socket; otherwise the cluster is started for as long as the caller needs it.
 */
export async function openDataDirDatabase(dataDir: string): Promise<{ url: string; stop(): Promise<void> }> {
  const dir = join(dataDir, 'postgres');
  const socketDir = join(dir, 'run');
  if (existsSync(join(dir, 'data')) && runningPostmaster(join(dir, 'data')) !== null) {
    return { url: `postgres://canto@localhost/canto?host=${encodeURIComponent(socketDir)}`, stop: async () => {} };
  }
  ensureDataDir(dataDir);
  const pg: EmbeddedPostgres = await startEmbeddedPostgres({ dir });
  return { url: pg.url, stop: () => pg.stop() };
}
