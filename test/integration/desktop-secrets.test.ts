/**
 * A desktop's sealed env and setup script are bound to its org (crypto/desktop-secrets.ts): the
 * first boot hands them to the agent; copied by someone who can write the database into another
 * org's desktop, they no longer open, and that desktop's wake fails without handing anything over.
 * Values sealed before the binding still open, and the next scheduler start seals them bound.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
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

    // Nor does turning the row's flag off open them (it only lets values sealed before the binding
    // open without a context), nor does a setup script put in the env's place.
    await sql`UPDATE desktops SET secrets_bound = false WHERE id = ${theirs}`;
    const flagged = (await globex('POST', `/v1/desktops/${theirs}/wake`, {})).json.id as string;
    const swapped = (await acme('POST', '/v1/desktops', { tier: 'small', env: { A: '1' }, setup_script: 'echo swapped' })).json.id as string;
    await sql`UPDATE desktops SET env_sealed = setup_script_sealed WHERE id = ${swapped}`;
    const swappedOp = (await acme('POST', `/v1/desktops/${swapped}/wake`, {})).json.id as string;
    for (const opId of [flagged, swappedOp]) {
      const settled = await until(async () => {
        const [o] = await sql<Array<{ state: string; error: { code: string } | null }>>`SELECT state, error FROM operations WHERE id = ${opId}`;
        return o!.state === 'failed' || o!.state === 'succeeded' ? o! : null;
      }, 5_000, 'the wake to settle');
      expect(settled).toMatchObject({ state: 'failed', error: { code: 'secrets_unreadable' } });
    }
    expect(agent.driver!.desktops.get(swapped)?.firstBoot ?? null).toBeNull();

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
    // Sealed again in the background of its start.
    await until(async () => (await sql`SELECT secrets_bound FROM desktops WHERE id = ${after}`)[0]!.secrets_bound === true, 5_000, 'the values bound');
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
