/**
 * The CLI's moving commands as users run them (the built bundle, `dist/cli.js`) against a
 * scheduler with two fake agents: `canto desktops move ID [--to HOST] [--wait] [--json]`, and
 * `canto hosts drain HOST --wait` when a desktop cannot be moved (exit 1, the reason, how to
 * resume) and when it is run again (it resumes and ends drained, exit 0).
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { adminApi, api, mintKey, startTestScheduler, TEST_ADMIN_TOKEN, until, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { AgentFailure } from '../../shared/src/protocol.js';

const CLI = join(import.meta.dirname, '..', '..', 'dist', 'cli.js');
const exec = promisify(execFile);

let s: TestScheduler;
let call: ReturnType<typeof api>;
let admin: ReturnType<typeof adminApi>;
let a: TestAgent;
let b: TestAgent;

async function canto(args: string[]) {
  const env = { PATH: process.env.PATH, HOME: process.env.HOME, CANTO_ADMIN_TOKEN: TEST_ADMIN_TOKEN, CANTO_API_URL: s.url };
  try {
    const { stdout, stderr } = await exec(process.execPath, [CLI, ...args], { env, timeout: 30_000 });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

beforeAll(async () => {
  s = await startTestScheduler({ CANTO_ADMIN_TOKEN: TEST_ADMIN_TOKEN, CANTO_HEARTBEAT_MS: '200' });
  call = api(s.url, await mintKey(s.databaseUrl, 'cli-moves'));
  admin = adminApi(s.url);
  a = await startFakeAgent(s.url, { delayMs: 0 });
  b = await startFakeAgent(s.url, { delayMs: 0 });
});

afterAll(async () => {
  await a?.stop();
  await b?.stop();
  await s?.close();
});

/** A desktop placed on `host` (the other one cordoned meanwhile), hibernated. */
async function desktopOn(host: TestAgent, other: TestAgent): Promise<string> {
  await admin('POST', `/admin/v1/hosts/${other.hostId}/cordon`);
  const id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id as string;
  await until(async () => (await call('GET', `/v1/desktops/${id}`)).json.state === 'hibernated', 10_000, 'the desktop to be placed');
  await admin('POST', `/admin/v1/hosts/${other.hostId}/uncordon`);
  expect((await call('GET', `/v1/desktops/${id}`)).json.host_id).toBe(host.hostId);
  return id;
}

it('moves a desktop to the host named, waiting for it, and answers the operation as JSON without waiting', async () => {
  const id = await desktopOn(a, b);
  const moved = await canto(['desktops', 'move', id, '--to', b.hostId, '--wait']);
  expect(moved.code, moved.stderr).toBe(0);
  expect(moved.stdout).toMatch(new RegExp(`^moved ${id} from ${a.hostId} to ${b.hostId} \\(`));
  expect((await call('GET', `/v1/desktops/${id}`)).json.host_id).toBe(b.hostId);

  const queued = await canto(['desktops', 'move', id, '--json']);
  expect(queued.code, queued.stderr).toBe(0);
  const op = JSON.parse(queued.stdout);
  expect(op).toMatchObject({ kind: 'move', desktop_id: id, source_host_id: b.hostId });
  await until(async () => (await admin('GET', `/admin/v1/operations/${op.id}`)).json.state === 'succeeded', 10_000, 'the move');
  expect((await call('GET', `/v1/desktops/${id}`)).json.host_id).toBe(a.hostId);
});

it('exits 1 from drain --wait when a desktop cannot be moved, saying why and how to resume; run again, it ends drained', async () => {
  const ids = [await desktopOn(a, b), await desktopOn(a, b)];
  const transfer = b.driver!.transfer;
  const install = transfer.install.bind(transfer);
  let calls = 0;
  transfer.install = async (desktopId, spec) => {
    if (calls++ === 0) throw new AgentFailure('runtime_error', 'no room on the target', false);
    return install(desktopId, spec);
  };
  const stopped = await canto(['hosts', 'drain', a.hostId, '--wait', '--parallel', '1']);
  expect(stopped.code).toBe(1);
  expect(stopped.stdout).toMatch(new RegExp(`^${a.hostId} drain stopped: desktop dsk_\\w+ could not be moved: .*drain again to resume\\)\\n$`));

  const resumed = await canto(['hosts', 'drain', a.hostId, '--wait', '--parallel', '1']);
  expect(resumed.code, resumed.stdout + resumed.stderr).toBe(0);
  // The two, and the one the first test moved back: all the host held.
  expect(resumed.stdout).toMatch(new RegExp(`^${a.hostId} drained in [\\d.]+ m?s: 3 desktops moved`));
  for (const id of ids) expect((await call('GET', `/v1/desktops/${id}`)).json.host_id).toBe(b.hostId);
});
