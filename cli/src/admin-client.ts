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
  const askedUrl = opts.api ?? (env.CANTO_API_URL || null);
  let token: string;
  let dataDir: string | null = opts.dataDir ?? null;
  if (opts.dataDir !== undefined) token = readAdminToken(opts.dataDir);
  else if (env.CANTO_ADMIN_TOKEN) token = env.CANTO_ADMIN_TOKEN;
  else if (existsSync(join(implicitDir, 'secrets.json'))) {
    token = readAdminToken(implicitDir);
    dataDir = implicitDir;
    // This machine's `canto up` token goes to its own API only: sent to another scheduler named
    // by --api, it would hand that server (over plain http, perhaps) this one's admin token.
    const own = recordedApiUrl(implicitDir) ?? DEFAULT_API_URL;
    if (askedUrl !== null && trimmed(askedUrl) !== trimmed(own)) {
      throw new Error(`no admin token for ${redacted(askedUrl)}: set CANTO_ADMIN_TOKEN (the token in ${implicitDir} is for ${own}), or pass --data-dir DIR of its canto up`);
    }
  } else {
    throw new Error(`no admin token: set CANTO_ADMIN_TOKEN, or pass --data-dir DIR of canto up (reads DIR/secrets.json)`);
  }
  // Sent as a header: a line break in it would split the request, and an error would echo it.
  if (!/^[\x21-\x7e]+$/.test(token)) throw new Error('the admin token has spaces, line breaks or other characters a token has not (check CANTO_ADMIN_TOKEN)');
  const url = askedUrl ?? ((dataDir && recordedApiUrl(dataDir)) || (existsSync(implicitDir) && recordedApiUrl(implicitDir)) || DEFAULT_API_URL);
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new Error(`--api must be an http(s) URL, got "${redacted(url)}"`);
  }
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') throw new Error(`--api must be an http(s) URL, got "${redacted(url)}"`);
  if (parsed.username !== '' || parsed.password !== '') throw new Error('--api must not hold a user or password: the admin token is the credential (CANTO_ADMIN_TOKEN)');
  return { url: trimmed(url), token };
}

function trimmed(url: string): string {
  return url.replace(/\/+$/, '');
}

/** `url` for a message, without a user and password it may hold. */
function redacted(url: string): string {
  return url.replace(/^([a-z][a-z0-9+.-]*:\/\/)[^/@]*@/i, '$1…@');
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
