/**
 * Desktops of every org through the admin API (`GET /admin/v1/desktops`, `GET /admin/v1/desktops/{id}`)
 * on a real scheduler with two fake agents: pages in id order that together list each desktop
 * once, filters by host, org and state (destroyed ones only when asked for), a desktop's host and
 * whether that host is up, and the operation at work on it; 400 for a page size out of range and
 * 404 for a desktop that does not exist. The CLI's `canto desktops list|show` read the same.
 */
import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { adminApi, api, mintKey, startTestScheduler, TEST_ADMIN_TOKEN, until, type TestScheduler } from '../helpers/scheduler.js';
import { slowDestroy, startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { expectProblem } from '../helpers/problem.js';

const CLI = join(import.meta.dirname, '..', '..', 'dist', 'cli.js');
const run = promisify(execFile);

let s: TestScheduler;
const agents: TestAgent[] = [];
let admin: ReturnType<typeof adminApi>;
/** Desktops by org, each on the host the test placed it on. */
const made: Array<{ id: string; org: 'acme' | 'globex'; host: string }> = [];
let acme: ReturnType<typeof api>;
let globex: ReturnType<typeof api>;

async function placedOn(call: ReturnType<typeof api>, org: 'acme' | 'globex', agent: TestAgent): Promise<string> {
  const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
  await until(async () => (await call('GET', `/v1/desktops/${id}`)).json.state === 'hibernated', 10_000, 'placed');
  expect((await call('GET', `/v1/desktops/${id}`)).json.host_id).toBe(agent.hostId);
  made.push({ id, org, host: agent.hostId });
  return id;
}

beforeAll(async () => {
  s = await startTestScheduler({ CANTO_ADMIN_TOKEN: TEST_ADMIN_TOKEN });
  admin = adminApi(s.url);
  for (let i = 0; i < 2; i++) agents.push(await startFakeAgent(s.url, { delayMs: 0 }));
  acme = api(s.url, await mintKey(s.databaseUrl, 'acme'));
  globex = api(s.url, await mintKey(s.databaseUrl, 'globex'));
  // Three desktops on the first host (two of acme), two on the second (one each).
  for (const [index, target] of agents.entries()) {
    const other = agents[1 - index]!;
    await admin('POST', `/admin/v1/hosts/${other.hostId}/cordon`);
    for (const org of index === 0 ? (['acme', 'acme', 'globex'] as const) : (['acme', 'globex'] as const)) {
      await placedOn(org === 'acme' ? acme : globex, org, target);
    }
    await admin('POST', `/admin/v1/hosts/${other.hostId}/uncordon`);
  }
});

afterAll(async () => {
  for (const agent of agents) await agent.stop();
  await s?.close();
});

describe('GET /admin/v1/desktops', () => {
  it('lists every desktop of every org once, in id order, a page at a time', async () => {
    const seen: string[] = [];
    let after: string | null = null;
    let pages = 0;
    do {
      const res = await admin('GET', `/admin/v1/desktops?limit=2${after === null ? '' : `&after=${after}`}`);
      expect(res.status, res.text).toBe(200);
      expect(res.json.desktops.length).toBeLessThanOrEqual(2);
      seen.push(...res.json.desktops.map((d: { id: string }) => d.id));
      after = res.json.next_after;
      pages++;
    } while (after !== null);
    expect(seen).toEqual(made.map((m) => m.id).sort());
    expect(pages).toBe(3);
  });

  it('says where each desktop is, and filters by host, org and state', async () => {
    const all = (await admin('GET', '/admin/v1/desktops')).json.desktops as any[];
    for (const m of made) {
      expect(all.find((d) => d.id === m.id)).toMatchObject({
        host_id: m.host, host_state: 'ready', state: 'hibernated', tier: 'small', operation: null, ephemeral: false, forked_from: null,
        org_id: expect.stringMatching(/^org_/), generation: expect.any(Number), created_at: expect.any(String),
      });
    }
    const ids = async (query: string) => ((await admin('GET', `/admin/v1/desktops?${query}`)).json.desktops as any[]).map((d) => d.id).sort();
    const expected = (keep: (m: (typeof made)[number]) => boolean) => made.filter(keep).map((m) => m.id).sort();
    expect(await ids(`host_id=${agents[0]!.hostId}`)).toEqual(expected((m) => m.host === agents[0]!.hostId));
    const acmeOrg = all.find((d) => d.id === made.find((m) => m.org === 'acme')!.id).org_id;
    expect(await ids(`org_id=${acmeOrg}`)).toEqual(expected((m) => m.org === 'acme'));
    expect(await ids(`org_id=${acmeOrg}&host_id=${agents[1]!.hostId}`)).toEqual(expected((m) => m.org === 'acme' && m.host === agents[1]!.hostId));
    expect(await ids('state=awake')).toEqual([]);
  });

  it('shows the operation at work on a desktop, and leaves destroyed desktops out unless asked', async () => {
    const victim = made.find((m) => m.org === 'globex' && m.host === agents[1]!.hostId)!;
    slowDestroy(agents[1]!, 1_500);
    const op = (await globex('POST', `/v1/desktops/${victim.id}/destroy`)).json;
    const during = (await admin('GET', `/admin/v1/desktops/${victim.id}`)).json;
    expect(during.operation).toMatchObject({ id: op.id, kind: 'destroy', state: expect.stringMatching(/^(pending|running)$/), phase: null });
    await until(async () => (await globex('GET', `/v1/operations/${op.id}`)).json.state === 'succeeded', 10_000, 'the destroy');
    const listed = ((await admin('GET', '/admin/v1/desktops')).json.desktops as any[]).map((d) => d.id);
    expect(listed).not.toContain(victim.id);
    const destroyed = (await admin('GET', '/admin/v1/desktops?state=destroyed')).json.desktops as any[];
    expect(destroyed.map((d) => d.id)).toEqual([victim.id]);
    expect(destroyed[0]).toMatchObject({ state: 'destroyed', operation: null });
    made.splice(made.indexOf(victim), 1);
  });

  it('answers 400 for a page size out of range or a malformed filter, and 404 for a desktop that does not exist', async () => {
    for (const query of ['limit=0', 'limit=1001', 'limit=x', 'state=asleep', 'host_id=nope', 'after=dsk_x', 'colour=blue']) {
      expectProblem(await admin('GET', `/admin/v1/desktops?${query}`), 400, query);
    }
    expectProblem(await admin('GET', '/admin/v1/desktops/dsk_000000000000000000000000'), 404, 'a missing desktop');
  });
});

describe('canto desktops list|show', () => {
  const canto = async (...args: string[]) =>
    (await run(process.execPath, [CLI, ...args, '--api', s.url], { env: { PATH: process.env.PATH, CANTO_ADMIN_TOKEN: TEST_ADMIN_TOKEN }, timeout: 30_000 })).stdout;

  it('lists desktops as a table, pages followed up to --limit, and shows one', async () => {
    const table = await canto('desktops', 'list', '--host', agents[0]!.hostId, '--org', 'acme');
    const lines = table.trim().split('\n');
    expect(lines[0]).toMatch(/^ID\s+ORG\s+STATE\s+TIER\s+HOST\s+GENERATION\s+OPERATION$/);
    expect(lines.slice(1).map((l) => l.split(/\s+/)[0]).sort()).toEqual(made.filter((m) => m.org === 'acme' && m.host === agents[0]!.hostId).map((m) => m.id).sort());
    const json = JSON.parse(await canto('desktops', 'list', '--limit', '3', '--json'));
    expect(json.desktops.map((d: { id: string }) => d.id)).toEqual(made.map((m) => m.id).sort().slice(0, 3));
    expect(json.next_after).toBe(json.desktops[2].id);
    const shown = await canto('desktops', 'show', made[0]!.id);
    expect(shown).toMatch(new RegExp(`^Host\\s+${made[0]!.host} \\(ready\\)$`, 'm'));
    expect(shown).toMatch(/Operation\s+none/);
  });
});
