/**
 * The CLI's side of the admin API: where it is and which token opens it, and one call that
 * turns every failure (a problem+json answer, a refused connection) into a one-line error.
 *
 * The token comes from a file or the environment, never from the command line, where every user
 * of the machine could read it (`ps`): `--data-dir DIR` reads `DIR/secrets.json`, else
 * `CANTO_ADMIN_TOKEN`, else the secrets of `CANTO_DATA_DIR` (or the default data directory) when
 * there are any. The API is `--api URL`, else `CANTO_API_URL`, else where the data directory's
 * `canto up` serves, else the default local address.
 */
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { DEFAULT_DATA_DIR, readAdminToken, recordedApiUrl } from './data-dir.js';

export interface AdminTarget {
  readonly url: string;
  readonly token: string;
}

export interface AdminOptions {
  api?: string;
  dataDir?: string;
  token?: string;
}

/** Where `canto up --listen` listens when not told otherwise. */
const DEFAULT_API_URL = 'http://127.0.0.1:8080';

export function adminTarget(opts: AdminOptions, env: NodeJS.ProcessEnv): AdminTarget {
  if (opts.token !== undefined) {
    throw new Error('--token would show the admin token to everyone on this host (ps); set CANTO_ADMIN_TOKEN or use --data-dir DIR');
  }
  const implicitDir = env.CANTO_DATA_DIR || DEFAULT_DATA_DIR;
  let token: string;
  let dataDir: string | null = opts.dataDir ?? null;
  if (opts.dataDir !== undefined) token = readAdminToken(opts.dataDir);
  else if (env.CANTO_ADMIN_TOKEN) token = env.CANTO_ADMIN_TOKEN;
  else if (existsSync(join(implicitDir, 'secrets.json'))) {
    token = readAdminToken(implicitDir);
    dataDir = implicitDir;
  } else {
    throw new Error(`no admin token: set CANTO_ADMIN_TOKEN, or pass --data-dir DIR of canto up (reads DIR/secrets.json)`);
  }
  const url = opts.api ?? (env.CANTO_API_URL || (dataDir && recordedApiUrl(dataDir)) || (existsSync(implicitDir) && recordedApiUrl(implicitDir)) || DEFAULT_API_URL);
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new Error(`--api must be an http(s) URL, got "${url}"`);
  }
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') throw new Error(`--api must be an http(s) URL, got "${url}"`);
  return { url: url.replace(/\/+$/, ''), token };
}

/**
 * Calls the admin API; resolves with the JSON answer (null for 204). A problem+json answer
 * becomes an error carrying its detail and status; so does an API that cannot be reached.
 */
export async function adminCall<T = unknown>(target: AdminTarget, method: string, path: string, body?: unknown): Promise<T> {
  let res: Response;
  try {
    res = await fetch(target.url + path, {
      method,
      headers: { authorization: `Bearer ${target.token}`, ...(body !== undefined ? { 'content-type': 'application/json' } : {}) },
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(30_000),
    });
  } catch (err) {
    const cause = (err as { cause?: { code?: string; message?: string } }).cause;
    const why = cause?.code ?? cause?.message ?? (err as Error).message;
    throw new Error(`cannot reach the admin API at ${target.url}: ${why} (is the scheduler running? --api URL names another)`);
  }
  const text = await res.text();
  if (res.ok) return (text ? JSON.parse(text) : null) as T;
  let detail = text.slice(0, 200) || res.statusText;
  try {
    const problem = JSON.parse(text) as { detail?: unknown };
    if (typeof problem.detail === 'string') detail = problem.detail;
  } catch {
    // Not problem+json (a proxy's page): its first characters say enough.
  }
  if (res.status === 401) detail = 'the admin API refused the token: is it the CANTO_ADMIN_TOKEN the scheduler runs with?';
  throw new Error(`${detail} (HTTP ${res.status} from ${method} ${path})`);
}
