/**
 * The CLI's moving commands as users run them (the built bundle, `dist/cli.js`) against a
 * scheduler with two fake agents: `canto desktops move ID [--to HOST] [--wait] [--json]`, and
 * `canto hosts drain HOST --wait` when a desktop cannot be moved (exit 1, the reason, how to
 * resume) and when it is run again (it resumes and ends drained, exit 0); `canto hosts show HOST
 * --wait` following a drain without asking for anything, Ctrl-C ending the watch and not the drain,
 * and `canto hosts uncordon` saying that it ended a drain (a watch elsewhere then ends, exit 1).
 */
import { afterAll, beforeAll, expect, it } from 'vitest';
import { execFile, spawn } from 'node:child_process';
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
  // Off a terminal (as here, and in CI) its progress is plain lines, not nothing.
  expect(moved.stderr).toMatch(new RegExp(`^moving ${id}: `, 'm'));
  expect(moved.stderr).not.toContain('\r');
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

it('follows a drain with hosts show --wait, stops watching on Ctrl-C while the drain goes on, and says when an uncordon ends it', async () => {
  const id = await desktopOn(b, a);
  // The copy to the target waits for the test: the drain stays under way meanwhile.
  let release: () => void = () => undefined;
  const gate = new Promise<void>((resolve) => (release = resolve));
  const transfer = a.driver!.transfer;
  const install = transfer.install.bind(transfer);
  transfer.install = async (desktopId, spec) => {
    await gate;
    return install(desktopId, spec);
  };
  expect((await canto(['hosts', 'drain', b.hostId])).stdout).toContain(`canto hosts show ${b.hostId} --wait`);
  const watchUntil = async (signal: boolean) => {
    const proc = spawn(process.execPath, [CLI, 'hosts', 'show', b.hostId, '--wait'], { env: { PATH: process.env.PATH, CANTO_ADMIN_TOKEN: TEST_ADMIN_TOKEN, CANTO_API_URL: s.url } });
    let stdout = '';
    let stderr = '';
    proc.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    proc.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const exited = new Promise<number | null>((resolve) => proc.once('exit', (code) => resolve(code)));
    await until(() => / \d+\/\d+ desktops, /.test(stderr), 10_000, 'the watch to draw its progress');
    if (signal) proc.kill('SIGINT');
    return { exited, out: () => ({ stdout, stderr }) };
  };
  const interrupted = await watchUntil(true);
  expect(await interrupted.exited).toBe(130);
  expect(interrupted.out().stderr).toContain(`stopped watching; the drain goes on (watch it again: canto hosts show ${b.hostId} --wait)`);
  expect((await admin('GET', `/admin/v1/hosts/${b.hostId}`)).json.drain.state).toBe('draining');

  const watching = await watchUntil(false);
  const onA = (await admin('GET', `/admin/v1/hosts/${a.hostId}`)).json.desktops.total as number;
  const running = (await admin('GET', `/admin/v1/hosts/${b.hostId}`)).json.drain.running as number;
  expect(running).toBeGreaterThan(0);
  const uncordoned = await canto(['hosts', 'uncordon', b.hostId]);
  expect(uncordoned.stdout).toBe(`host ${b.hostId} uncordoned: placement may use it again; its drain (draining) ended, moves under way finish\n`);
  expect(await watching.exited).toBe(1);
  expect(watching.out().stdout).toBe(`${b.hostId}: no drain (it ended when the host was uncordoned, or none was asked for)\n`);
  // Asked to follow a drain that has ended, it says so and exits as drain --wait would.
  const ended = await canto(['hosts', 'show', b.hostId, '--wait']);
  expect(ended.code).toBe(1);
  expect(ended.stdout).toContain(`${b.hostId}: no drain`);
  release();
  await until(async () => (await admin('GET', `/admin/v1/hosts/${a.hostId}`)).json.desktops.total === onA + running, 10_000, 'the moves under way to finish');
  expect((await call('GET', `/v1/desktops/${id}`)).json.state).toBe('hibernated');
});
