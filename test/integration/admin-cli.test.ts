/**
 * The CLI's admin commands as users run them (the built bundle, `dist/cli.js`, which `npm test`
 * builds first) against a scheduler with a fake agent: `canto hosts list|show|cordon|uncordon|
 * remove`, `canto orgs list|create` and `canto keys list|create|revoke`, with the token from a
 * data directory's secrets.json (and the API where its `canto up` recorded it) or from
 * CANTO_ADMIN_TOKEN; tables for people, `--json` for scripts, one-line errors and a non-zero exit.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { api, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { freePort } from '../helpers/processes.js';
import { connectDatabase } from '../../scheduler/src/store/db.js';

const CLI = join(import.meta.dirname, '..', '..', 'dist', 'cli.js');
const ADMIN_TOKEN = 'cli-admin-token-0123456789abcdefghijklmnopq';
const exec = promisify(execFile);

let s: TestScheduler;
let agent: TestAgent;
const dataDir = mkdtempSync(join(tmpdir(), 'canto-admin-cli-'));
/** No token and no data directory unless a test gives one. */
const bareEnv = { PATH: process.env.PATH, HOME: process.env.HOME, CANTO_DATA_DIR: join(dataDir, 'none') };

async function canto(args: string[], env: Record<string, string | undefined> = {}) {
  try {
    const { stdout, stderr } = await exec(process.execPath, [CLI, ...args], { env: { ...bareEnv, ...env }, timeout: 30_000 });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

const withDir = (args: string[]) => canto([...args, '--data-dir', dataDir]);
const withEnv = (args: string[]) => canto([...args, '--api', s.url], { CANTO_ADMIN_TOKEN: ADMIN_TOKEN });

beforeAll(async () => {
  s = await startTestScheduler({ CANTO_ADMIN_TOKEN: ADMIN_TOKEN });
  agent = await startFakeAgent(s.url);
  // What `canto up` leaves in its data directory.
  writeFileSync(join(dataDir, 'secrets.json'), JSON.stringify({ secret_key: 'unused', join_token: 'unused', admin_token: ADMIN_TOKEN }), { mode: 0o600 });
  writeFileSync(join(dataDir, 'up.json'), JSON.stringify({ api_url: s.url }));
  await until(async () => (await withEnv(['hosts', 'list'])).stdout.includes('ready'), 10_000, 'the host ready');
});

afterAll(async () => {
  await agent?.stop();
  await s?.close();
  rmSync(dataDir, { recursive: true, force: true });
});

describe('canto hosts', () => {
  it('lists hosts as a table from a data directory, and as JSON with the token from the environment', async () => {
    const listed = await withDir(['hosts', 'list']);
    expect(listed.code, listed.stderr).toBe(0);
    expect(listed.stdout).toMatch(/^ID\s+HOSTNAME\s+STATUS\s+RUNTIME\s+SCHEDULABLE\s+DESKTOPS\s+VCPU\s+MEMORY\s+FREE MEMORY\s+ROOM\s+SLOTS\s+LINKS\s+LAST HEARD\n/);
    // No nominal CPU or memory cap by default: only what is committed; free memory as measured,
    // and how many more desktops that memory admits.
    expect(listed.stdout).toMatch(new RegExp(`${agent.hostId}\\s+\\S+\\s+ready\\s+fake\\S*\\s+yes\\s+0 \\(0 awake\\)\\s+0\\s+0\\.0 GiB\\s+(-|[\\d.]+ GiB)\\s+\\d+\\s+0/2048\\s+(1/1|0/1 linking)\\s`));
    const json = JSON.parse((await withEnv(['hosts', 'list', '--json'])).stdout);
    expect(json.hosts).toEqual([expect.objectContaining({ id: agent.hostId, state: 'ready', schedulable: true })]);
  });

  it('shows one host, cordons and uncordons it', async () => {
    const shown = await withDir(['hosts', 'show', agent.hostId]);
    expect(shown.stdout).toMatch(/^ID\s+host_/);
    expect(shown.stdout).toMatch(/Schedulable\s+yes/);
    expect(shown.stdout).toMatch(/Slots\s+0 of 2048 held/);
    expect(shown.stdout).toMatch(/Room\s+\d+ MiB above its \d+ MiB reserve: \d+ more desktops by measured memory/);
    expect((await withDir(['hosts', 'cordon', agent.hostId])).stdout).toBe(`host ${agent.hostId} cordoned: no new desktop is placed on it\n`);
    const cordoned = JSON.parse((await withEnv(['hosts', 'cordon', agent.hostId, '--json'])).stdout);
    expect(cordoned).toMatchObject({ cordoned: true, schedulable: false });
    expect((await withDir(['hosts', 'list'])).stdout).toMatch(/ready,cordoned\s+fake\S*\s+no/);
    // A drain that stopped reads so in the list, as in canto status.
    const sql = connectDatabase(s.databaseUrl, { max: 1 });
    try {
      await sql`UPDATE hosts SET drain_requested_at = now(), drain_error = 'move of dsk_x failed' WHERE id = ${agent.hostId}`;
    } finally {
      await sql.end();
    }
    expect((await withDir(['hosts', 'list'])).stdout).toMatch(/ready,cordoned,drain stopped\s+fake\S*\s+no/);
    // A drain that finished reads drained: the host can go once its agent is stopped.
    const db = connectDatabase(s.databaseUrl, { max: 1 });
    try {
      await db`UPDATE hosts SET drain_error = NULL, drain_finished_at = now() WHERE id = ${agent.hostId}`;
    } finally {
      await db.end();
    }
    expect((await withDir(['hosts', 'list'])).stdout).toMatch(/ready,cordoned,drained\s+fake\S*\s+no/);
    expect((await withDir(['hosts', 'uncordon', agent.hostId])).stdout).toContain('uncordoned');
    expect((await withDir(['hosts', 'list'])).stdout).toMatch(new RegExp(`${agent.hostId}\\s+\\S+\\s+ready\\s+fake`));
  });

  it('fails in one line with the API\'s reason, and exits non-zero', async () => {
    const removed = await withDir(['hosts', 'remove', agent.hostId]);
    expect(removed.code).toBe(1);
    expect(removed.stdout).toBe('');
    expect(removed.stderr).toMatch(/^canto: the host's agent is still connected; .* \(HTTP 409 from DELETE \/admin\/v1\/hosts\/host_\w+\)\n$/);
    const missing = await withDir(['hosts', 'show', 'host_000000000000000000000000']);
    expect(missing.stderr).toBe('canto: host not found (HTTP 404 from GET /admin/v1/hosts/host_000000000000000000000000)\n');
  });

  it('names what is wrong with the token or the address', async () => {
    const wrong = await canto(['hosts', 'list', '--api', s.url], { CANTO_ADMIN_TOKEN: 'x'.repeat(40) });
    expect(wrong).toMatchObject({ code: 1, stderr: expect.stringMatching(/^canto: the admin API refused the token.*HTTP 401/) });
    const none = await canto(['hosts', 'list', '--api', s.url]);
    expect(none).toMatchObject({ code: 1, stderr: expect.stringContaining('no admin token: set CANTO_ADMIN_TOKEN, or pass --data-dir') });
    const onCommandLine = await canto(['hosts', 'list', '--token', ADMIN_TOKEN]);
    expect(onCommandLine).toMatchObject({ code: 1, stderr: expect.stringContaining('--token would show the admin token') });
    const closed = await freePort();
    const unreachable = await canto(['hosts', 'list', '--api', `http://127.0.0.1:${closed}`], { CANTO_ADMIN_TOKEN: ADMIN_TOKEN });
    expect(unreachable).toMatchObject({ code: 1, stderr: expect.stringContaining(`canto: cannot reach the admin API at http://127.0.0.1:${closed}: ECONNREFUSED`) });
  });
});

describe('credentials on their way', () => {
  it("keeps this machine's canto up token from another scheduler named by --api", async () => {
    // The data directory found without asking (CANTO_DATA_DIR), its API recorded as s.url.
    const elsewhere = await canto(['hosts', 'list', '--api', 'http://scheduler.example:8080'], { CANTO_DATA_DIR: dataDir });
    expect(elsewhere).toMatchObject({ code: 1, stderr: expect.stringContaining('no admin token for http://scheduler.example:8080: set CANTO_ADMIN_TOKEN') });
    expect(elsewhere.stderr).not.toContain(ADMIN_TOKEN);
    // Its own API is fine, named or not.
    expect((await canto(['hosts', 'list', '--api', s.url], { CANTO_DATA_DIR: dataDir })).code).toBe(0);
    expect((await canto(['hosts', 'list'], { CANTO_DATA_DIR: dataDir })).code).toBe(0);
  });

  it('never echoes a password or a token in its errors', async () => {
    const userinfo = await canto(['hosts', 'list', '--api', 'http://admin:hunter2@127.0.0.1:1'], { CANTO_ADMIN_TOKEN: ADMIN_TOKEN });
    expect(userinfo).toMatchObject({ code: 1, stderr: expect.stringContaining('--api must not hold a user or password') });
    const badScheme = await canto(['hosts', 'list', '--api', 'ftp://admin:hunter2@example'], { CANTO_ADMIN_TOKEN: ADMIN_TOKEN });
    expect(badScheme.code).toBe(1);
    const broken = await canto(['hosts', 'list', '--api', s.url], { CANTO_ADMIN_TOKEN: `${ADMIN_TOKEN}\nX-Injected: 1` });
    expect(broken).toMatchObject({ code: 1, stderr: expect.stringContaining('the admin token has spaces, line breaks') });
    const dbPassword = await canto(['status', '--database-url', 'postgres://canto:hunter2@127.0.0.1:1/canto']);
    expect(dbPassword).toMatchObject({ code: 1, stderr: expect.stringContaining('--database-url would show its password') });
    for (const r of [userinfo, badScheme, broken, dbPassword]) {
      expect(r.stderr).not.toContain('hunter2');
      expect(r.stderr).not.toContain(ADMIN_TOKEN);
    }
  });

  it('says why a connection failed when every address of a name refused it', async () => {
    // `localhost` has two addresses here: Node tries both and throws an error whose own message is empty.
    const closed = await freePort();
    const refused = await canto(['status', '--database-url', `postgres://canto@localhost:${closed}/canto`]);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(/^canto: .*ECONNREFUSED/);
  });
});

describe('canto orgs and canto keys', () => {
  it('creates an org, and keys by org name (creating a new org) printing only the key', async () => {
    expect((await withDir(['orgs', 'create', 'initech'])).stdout).toMatch(/^org initech created: org_[0-9a-v]{24}\n$/);
    expect((await withDir(['orgs', 'create', 'initech'])).stderr).toContain('an org with this name exists (HTTP 409');
    const key = await withDir(['keys', 'create', '--org', 'initech', '--name', 'ci']);
    expect(key.stdout).toMatch(/^svc_sk_[A-Za-z0-9_-]{43}\n$/);
    expect((await api(s.url, key.stdout.trim())('GET', '/v1/desktops')).status).toBe(200);
    const fresh = await withDir(['keys', 'create', '--org', 'newco']);
    expect(fresh.stdout).toMatch(/^svc_sk_/);
    const orgs = JSON.parse((await withDir(['orgs', 'list', '--json'])).stdout).orgs as any[];
    expect(orgs.map((o) => [o.name, o.key_count])).toEqual(expect.arrayContaining([['initech', 1], ['newco', 1]]));
    expect((await withDir(['orgs', 'list'])).stdout).toMatch(/^ID\s+NAME\s+KEYS\s+DESKTOPS\s+CREATED\n/);
  });

  it('lists an org\'s keys without their secrets and revokes one', async () => {
    const created = JSON.parse((await withDir(['keys', 'create', '--org', 'initech', '--name', 'temp', '--json'])).stdout);
    expect(created).toMatchObject({ id: expect.stringMatching(/^key_/), name: 'temp', key: expect.stringMatching(/^svc_sk_/) });
    const listed = await withDir(['keys', 'list', '--org', 'initech']);
    expect(listed.stdout).toMatch(/^ID\s+NAME\s+PREFIX\s+CREATED\s+LAST USED\n/);
    expect(listed.stdout).toContain(created.id);
    expect(listed.stdout).toContain(created.prefix);
    expect(listed.stdout).not.toContain(created.key);
    expect((await withDir(['keys', 'revoke', '--org', 'initech', created.id])).stdout).toBe(`key ${created.id} revoked\n`);
    expect((await api(s.url, created.key)('GET', '/v1/desktops')).status).toBe(401);
    expect((await withDir(['keys', 'revoke', '--org', 'initech', created.id])).stderr).toContain('API key not found (HTTP 404');
    expect((await withDir(['keys', 'list', '--org', 'nosuch'])).stderr).toBe('canto: no org is named "nosuch" (canto orgs list shows them)\n');
  });
});
