/**
 * A partial partition: the host's agent reaches one replica and not the other, the leader. Its
 * heartbeats still arrive through the follower, so the host reads `ready`, while the leader's
 * lifecycle operations there cannot reach it. What an SRE sees: the admin API lists which replicas
 * the agent is linked to (`links`), `canto hosts show` says the leader is cut off, and `canto
 * status` warns — after a few seconds of settling, never for links still forming.
 *
 * The cut is made by advertising the leader at an address nothing listens on: agents dial each
 * replica where it says it is, so this agent never links to it.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort } from '../helpers/processes.js';
import { startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { connectDatabase, type Sql } from '../../scheduler/src/store/db.js';
import { formatFleetStatus, readFleetStatus } from '../../cli/src/status.js';
import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { LINK_SETTLE_MS } from '../../scheduler/src/fleet/link-view.js';

const ADMIN_TOKEN = 'test-admin-token-0123456789abcdefghijklmnop';
const CLI = join(import.meta.dirname, '..', '..', 'dist', 'cli.js');

/** The built CLI against the follower, with the admin token: what an SRE runs. */
async function canto(args: string[]): Promise<string> {
  const { stdout } = await promisify(execFile)(process.execPath, [CLI, ...args, '--api', follower.url], {
    env: { PATH: process.env.PATH, HOME: process.env.HOME, CANTO_ADMIN_TOKEN: ADMIN_TOKEN },
    timeout: 30_000,
  });
  return stdout;
}

let leader: TestScheduler;
let follower: TestScheduler;
let agent: TestAgent;
let sql: Sql;

beforeAll(async () => {
  // Started first, it takes the lease; agents are told to dial it where nothing answers.
  leader = await startTestScheduler({ CANTO_REPLICA_ID: 'cut-leader', CANTO_ADVERTISE_URL: `http://127.0.0.1:${await freePort()}`, CANTO_ADMIN_TOKEN: ADMIN_TOKEN });
  await until(() => leader.leadership.isLeader(), 5_000, 'the first replica to lead');
  follower = await startTestScheduler({ CANTO_REPLICA_ID: 'cut-follower', CANTO_SECRET_KEY: leader.env.CANTO_SECRET_KEY!, CANTO_ADMIN_TOKEN: ADMIN_TOKEN }, leader.databaseUrl);
  agent = await startFakeAgent(follower.url);
  sql = connectDatabase(leader.databaseUrl, { max: 1 });
});

afterAll(async () => {
  await sql?.end();
  await agent?.stop();
  await follower?.close();
  await leader?.close();
});

async function hostLinks(): Promise<any> {
  const res = await fetch(`${follower.url}/admin/v1/hosts/${agent.hostId}`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } });
  expect(res.status).toBe(200);
  return res.json();
}

describe('a host cut off from the leader', () => {
  it('reads ready, and says so while its links settle, then that the leader is unlinked', async () => {
    const early = await until(async () => {
      const h = await hostLinks();
      return h.state === 'ready' && h.links.linked.length === 1 ? h : null;
    }, 5_000, 'the host ready and linked to the follower');
    // Within the settling time the missing link is not called missing yet.
    expect(early.links).toMatchObject({ linked: ['cut-follower'], unlinked: [], settling: ['cut-leader'], leader: 'cut-leader', leader_linked: null });
    expect((await readFleetStatus(sql)).warnings).toEqual([]);

    const cut = await until(async () => ((await hostLinks()).links.unlinked.length === 1 ? hostLinks() : null), LINK_SETTLE_MS + 3_000, 'the link counted missing');
    expect(cut.state).toBe('ready');
    expect(cut.links).toEqual({ linked: ['cut-follower'], unlinked: ['cut-leader'], settling: [], leader: 'cut-leader', leader_linked: false });

    const status = await readFleetStatus(sql);
    expect(status.warnings).toEqual([
      expect.stringMatching(new RegExp(`^host ${agent.hostId} \\(.*\\): its agent is not linked to the leader cut-leader \\(it reaches only cut-follower\\): wakes, hibernates and moves there wait and fail host_unavailable`)),
    ]);
    expect(formatFleetStatus(status)).toMatch(new RegExp(`${agent.hostId}\\s+\\S+\\s+ready\\s+\\S+ s ago\\s+1/2 not leader\\s`));

    expect(await canto(['hosts', 'show', agent.hostId])).toMatch(/Links\s+linked to 1 of 2 replicas; ! its agent is not linked to the leader cut-leader/);
    expect(await canto(['hosts', 'list'])).toContain('1/2 not leader');
  });
});
