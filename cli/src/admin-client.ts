/**
 * The CLI's side of the admin API: where it is and which token opens it, the SDK's admin client
 * (sdk/) bound to them, and the one-line error every failure (a problem+json answer, a refused
 * connection) becomes.
 *
 * The token comes from a file or the environment, never from the command line, where every user
 * of the machine could read it (`ps`): `--data-dir DIR` reads `DIR/secrets.json`, else
 * `CANTO_ADMIN_TOKEN`, else the secrets of `CANTO_DATA_DIR` (or the default data directory) when
 * there are any. The API is `--api URL`, else `CANTO_API_URL`, else where the data directory's
 * `canto up` serves, else the default local address.
 */
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { CantoConnectionError, CantoProblem, UnauthorizedProblem, createCantoAdmin, type CantoAdmin } from '../../sdk/src/index.js';
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
 * The SDK's admin client for `target`. A refused connection fails at once (a scheduler that is
 * down is not coming back within a command's patience; a `--wait` watch, which runs for minutes,
 * rides out a minute of it: drain-progress.ts); a 503 is retried after its Retry-After.
 */
export function adminClient(target: AdminTarget): CantoAdmin {
  return createCantoAdmin({ baseUrl: target.url, adminToken: target.token, timeoutMs: 30_000, retry: { onConnectionError: false } });
}

/**
 * The one-line error a failed admin call becomes: the problem's detail with its status, method
 * and path (the SDK's message), a hint for a refused token, and where the CLI looked for an API
 * it could not reach.
 */
export function explainAdminError(err: unknown, target: AdminTarget): unknown {
  if (err instanceof UnauthorizedProblem) {
    return new Error(`the admin API refused the token: is it the CANTO_ADMIN_TOKEN the scheduler runs with? (HTTP 401 from ${err.method} ${err.path})`);
  }
  if (err instanceof CantoProblem) return new Error(err.message);
  if (err instanceof CantoConnectionError) {
    const why = err.code === 'TimeoutError' ? 'no answer within 30 s' : err.code;
    return new Error(`cannot reach the admin API at ${target.url}: ${why} (is the scheduler running? --api URL names another)`);
  }
  return err;
}
