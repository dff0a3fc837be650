/**
 * Starts a real scheduler in-process on 127.0.0.1:0 against a fresh database, plus helpers to
 * mint API keys and call the API over real sockets.
 */
import { generateSecretKey } from '../../scheduler/src/crypto/secret-box.js';
import { loadSchedulerConfig } from '../../scheduler/src/config.js';
import { startScheduler, type RunningScheduler } from '../../scheduler/src/main.js';
import { connectDatabase } from '../../scheduler/src/store/db.js';
import { createApiKey } from '../../scheduler/src/services/keys.js';
import { silentLogger } from '../../shared/src/log.js';
import { freshDatabaseUrl } from './db.js';

export const JOIN_TOKEN = 'test-join-token-0123456789abcdef';

export interface TestScheduler extends RunningScheduler {
  databaseUrl: string;
  env: Record<string, string>;
}

export async function startTestScheduler(env: Record<string, string> = {}, databaseUrl?: string): Promise<TestScheduler> {
  const url = databaseUrl ?? (await freshDatabaseUrl());
  const fullEnv = {
    DATABASE_URL: url,
    CANTO_SECRET_KEY: env.CANTO_SECRET_KEY ?? generateSecretKey(),
    CANTO_LISTEN: '127.0.0.1:0',
    CANTO_JOIN_TOKEN: JOIN_TOKEN,
    CANTO_LEASE_TTL_MS: '3000',
    CANTO_LEASE_RENEW_MS: '300',
    CANTO_ENGINE_POLL_MS: '100',
    CANTO_WAIT_POLL_MS: '200',
    CANTO_IDLE_SWEEP_MS: '200',
    CANTO_HOST_WAIT_MS: '5000',
    CANTO_OPERATION_DEADLINE_MS: '20000',
    ...env,
  };
  const scheduler = await startScheduler(loadSchedulerConfig(fullEnv), silentLogger());
  return Object.assign(scheduler, { databaseUrl: url, env: fullEnv });
}

export async function mintKey(databaseUrl: string, org: string): Promise<string> {
  const sql = connectDatabase(databaseUrl, { max: 1 });
  try {
    return (await createApiKey(sql, org)).key;
  } finally {
    await sql.end();
  }
}

import { until } from './wait.js';
export { until };

export function api(base: string, key: string) {
  return async (method: string, path: string, body?: unknown, headers: Record<string, string> = {}) => {
    const res = await fetch(base + path, {
      method,
      headers: {
        authorization: `Bearer ${key}`,
        ...(body !== undefined ? { 'content-type': 'application/json' } : {}),
        ...headers,
      },
      body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
    });
    return readResponse(res);
  };
}

/** A small desktop of the caller's org, created and woken; throws unless the wake succeeded. */
export async function awakeDesktop(call: ReturnType<typeof api>): Promise<string> {
  const created = await call('POST', '/v1/desktops', { tier: 'small' });
  const woke = await call('POST', `/v1/desktops/${created.json.id}/wake?wait=true`);
  if (woke.json?.state !== 'succeeded') throw new Error(`the wake did not succeed: ${woke.status} ${woke.text}`);
  return created.json.id as string;
}

/** The admin token tests start schedulers with (`CANTO_ADMIN_TOKEN`, at least 32 characters). */
export const TEST_ADMIN_TOKEN = 'test-admin-token-0123456789abcdefghijklmnop';

/** Calls a scheduler's admin API (`/admin/v1`): `api` with the admin token as the bearer. */
export function adminApi(base: string, token = TEST_ADMIN_TOKEN) {
  return api(base, token);
}

/** The operation `id` once it has settled (succeeded or failed), read through the admin API. */
export async function settledOperation(admin: ReturnType<typeof adminApi>, id: string, timeoutMs = 30_000): Promise<any> {
  return until(async () => {
    const op = (await admin('GET', `/admin/v1/operations/${id}`)).json;
    return op.state === 'succeeded' || op.state === 'failed' ? op : null;
  }, timeoutMs, `operation ${id} to settle`);
}

/** Moves the desktop to `hostId` through the admin API; answers the move once it has settled. */
export async function moveSettled(admin: ReturnType<typeof adminApi>, desktopId: string, hostId: string): Promise<any> {
  const requested = await admin('POST', `/admin/v1/desktops/${desktopId}/move`, { host_id: hostId });
  if (requested.status !== 202) throw new Error(`the move was refused: ${requested.status} ${requested.text}`);
  return settledOperation(admin, requested.json.id as string);
}

/** A response's status, headers, text and (when it parses) JSON body. */
export async function readResponse(res: Response) {
  const text = await res.text();
  let json: any = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch {
    json = null;
  }
  return { status: res.status, headers: res.headers, text, json };
}
