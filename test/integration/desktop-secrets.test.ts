/**
 * A desktop's sealed env and setup script are bound to its org (crypto/desktop-secrets.ts): the
 * first boot hands them to the agent; copied by someone who can write the database into another
 * org's desktop, they no longer open, and that desktop's wake fails without handing anything over.
 * Values sealed before the binding still open, and the next scheduler start seals them bound.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, mintKey, startTestScheduler, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { createSecretBox, parseSecretKey } from '../../scheduler/src/crypto/secret-box.js';
import { openDesktopSecret } from '../../scheduler/src/crypto/desktop-secrets.js';

let s: TestScheduler;
let agent: TestAgent;
let sql: Sql;
let acme: ReturnType<typeof api>;
let globex: ReturnType<typeof api>;

beforeAll(async () => {
  s = await startTestScheduler();
  agent = await startFakeAgent(s.url, { delayMs: 0 });
  sql = connectDatabase(s.databaseUrl, { max: 1 });
  acme = api(s.url, await mintKey(s.databaseUrl, 'acme'));
  globex = api(s.url, await mintKey(s.databaseUrl, 'globex'));
});

afterAll(async () => {
  await sql?.end();
  await agent?.stop();
  await s?.close();
});

async function wake(call: ReturnType<typeof api>, id: string) {
  return call('POST', `/v1/desktops/${id}/wake?wait=true`, {});
}

describe('desktop secrets bound to their org', () => {
  it('open at the first boot; moved to another org, they do not, and nothing reaches the agent', async () => {
    const mine = (await acme('POST', '/v1/desktops', { tier: 'small', env: { TOKEN: 'acme-secret' }, setup_script: 'echo acme' })).json.id as string;
    const theirs = (await globex('POST', '/v1/desktops', { tier: 'small', env: { TOKEN: 'globex-own' } })).json.id as string;
    const [row] = await sql<Array<{ secrets_bound: boolean }>>`SELECT secrets_bound FROM desktops WHERE id = ${mine}`;
    expect(row!.secrets_bound).toBe(true);

    // Someone with write access to the database, not the key, moves acme's secrets to globex.
    await sql`UPDATE desktops SET env_sealed = (SELECT env_sealed FROM desktops WHERE id = ${mine}),
      setup_script_sealed = (SELECT setup_script_sealed FROM desktops WHERE id = ${mine}) WHERE id = ${theirs}`;
    const refused = await wake(globex, theirs);
    expect(refused.status).toBeGreaterThanOrEqual(400);
    const [op] = await sql<Array<{ state: string; error: { message?: string } | null }>>`
      SELECT state, error FROM operations WHERE desktop_id = ${theirs} AND kind = 'wake'`;
    expect(op!.state).toBe('failed');
    expect(op!.error).toEqual({ code: 'secrets_unreadable', message: expect.stringMatching(/does not open with this deployment's key/) });
    expect(agent.driver!.desktops.get(theirs)?.firstBoot ?? null).toBeNull();

    // Its own org's desktop boots with them.
    expect((await wake(acme, mine)).json.state).toBe('succeeded');
    expect(agent.driver!.desktops.get(mine)?.firstBoot).toEqual({ env: { TOKEN: 'acme-secret' }, setupScript: 'echo acme' });
  });

  it('opens values sealed before the binding, and the next start seals them bound', async () => {
    const box = createSecretBox(parseSecretKey(s.env.CANTO_SECRET_KEY!));
    const legacy = async (env: Record<string, string>, script: string) => {
      const id = (await acme('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
      // As an older version sealed them: no context.
      await sql`UPDATE desktops SET env_sealed = ${box.seal(JSON.stringify(env))}, setup_script_sealed = ${box.seal(script)},
        secrets_bound = false WHERE id = ${id}`;
      return id;
    };
    const before = await legacy({ OLD: 'first' }, 'echo first');
    const after = await legacy({ OLD: 'second' }, 'echo second');
    expect((await wake(acme, before)).json.state).toBe('succeeded');
    expect(agent.driver!.desktops.get(before)?.firstBoot).toEqual({ env: { OLD: 'first' }, setupScript: 'echo first' });

    const again = await startTestScheduler({ CANTO_SECRET_KEY: s.env.CANTO_SECRET_KEY! }, s.databaseUrl);
    await again.close();
    const [row] = await sql<Array<{ org_id: string; env_sealed: Buffer; setup_script_sealed: Buffer; secrets_bound: boolean }>>`
      SELECT org_id, env_sealed, setup_script_sealed, secrets_bound FROM desktops WHERE id = ${after}`;
    expect(row!.secrets_bound).toBe(true);
    expect(() => box.open(row!.env_sealed)).toThrow(/failed authentication/);
    expect(openDesktopSecret(box, row!.org_id, 'env', row!.env_sealed, true)).toBe('{"OLD":"second"}');
    expect(openDesktopSecret(box, row!.org_id, 'setup_script', row!.setup_script_sealed, true)).toBe('echo second');
    expect((await wake(acme, after)).json.state).toBe('succeeded');
    expect(agent.driver!.desktops.get(after)?.firstBoot).toEqual({ env: { OLD: 'second' }, setupScript: 'echo second' });
  });
});
