/**
 * What `canto hosts drain --wait` and `canto desktops move --wait` say (cli/src/drain-progress.ts):
 * the progress line's whole is every desktop of the drain, those moving included, so it neither
 * shrinks nor jumps while moves run; and a watch rides out an API it briefly cannot reach.
 */
import { expect, it } from 'vitest';
import { describeDrain, describeMove, drainDetails, moveLine, progressLine, readThrough, watchStart } from '../../cli/src/drain-progress.js';
import { CantoConnectionError, CantoProblem } from '../../sdk/src/index.js';
import type { AdminHost, AdminOperation } from '../../sdk/src/index.js';

/** A watch that began with the drain, at time 0. */
const FROM_START = { atMs: 0, moved: 0, bytes: 0 };

function host(moved: number, running: number, remaining: number, state = 'draining'): AdminHost {
  const drain = {
    state, requested_at: new Date(0).toISOString(), parallel: 2, moved, running, remaining,
    failed: 0, moved_bytes: moved * 1024 * 1024, total_bytes: (moved + running) * 1024 * 1024, down_targets: [], error: null,
  };
  return { id: 'host_a', drain } as unknown as AdminHost;
}

it('counts the desktops being moved in the whole, and the time left from those moved', () => {
  expect(progressLine(host(0, 2, 2), FROM_START, 1_000)).toMatch(/^\[\.+\] 0\/4 desktops, 0\.0 MiB at 0\.0 MiB\/s, 2 moving$/);
  // Two moved, two moving, none waiting: half done, 2 s left at 1 s per desktop.
  expect(progressLine(host(2, 2, 0), FROM_START, 2_000)).toMatch(/^\[#{12}\.{12}\] 2\/4 desktops, 2\.0 MiB at 1\.0 MiB\/s, 2 moving ETA 2 s$/);
  expect(progressLine(host(4, 0, 0), FROM_START, 4_000)).toMatch(/^\[#{24}\] 4\/4 desktops/);
});

it('counts the rate and the time left from what moved since the watch began, not before it', () => {
  // A resumed drain had moved two desktops (2 MiB); in the 2 s this watch ran, one more moved.
  const since = watchStart(host(2, 1, 1), 0);
  expect(progressLine(host(3, 1, 0), since, 2_000)).toMatch(/ 3\/4 desktops, 3\.0 MiB at 0\.5 MiB\/s, 1 moving ETA 2 s$/);
  expect(progressLine(host(2, 1, 1), since, 1_000)).toMatch(/ at 0\.0 MiB\/s, 1 moving$/);
});

it('describes a drain in full for hosts show, and a stopped one with the moves still running', () => {
  const stopped = host(1, 1, 2, 'stopped');
  stopped.drain = { ...stopped.drain!, failed: 1, error: 'move of dsk_x failed', down_targets: ['host_t'] };
  expect(describeDrain(stopped)).toBe('host_a drain stopped: move of dsk_x failed (1 moved, 1 still moving, 2 left; drain again to resume)');
  expect(drainDetails(stopped).map(([k, v]) => `${k.trim()}: ${v}`)).toEqual([
    `Drain: ${describeDrain(stopped)}`,
    'copied: 1.0 MiB of 2.0 MiB known so far, 2 move(s) at a time',
    `requested: ${new Date(0).toISOString()}`,
    'failed: 1 move(s)',
    'waiting on: host_t (target hosts that are down: the moves to them wait for their agents)',
  ]);
});

it('says why the bar stands still while the drained host is down', () => {
  const down = { ...host(1, 2, 1), state: 'down', last_heartbeat_at: new Date(Date.now() - 42_000).toISOString() } as AdminHost;
  expect(progressLine(down, FROM_START, 5_000)).toMatch(/ 2 moving ETA \d+ s; the host is down \(last heard 4[23] s ago\): its moves wait for its agent$/);
  expect(progressLine({ ...down, state: 'ready' } as AdminHost, FROM_START, 5_000)).not.toMatch(/down/);
});

it('says which target is down while the moves to it wait', () => {
  const waiting = host(1, 2, 1);
  waiting.drain = { ...waiting.drain!, down_targets: ['host_t'] };
  expect(progressLine(waiting, FROM_START, 5_000)).toMatch(/ 2 moving ETA \d+ s; host_t, a target, is down: the moves to it wait for its agent$/);
});

it('says which host of a move is down while the move waits for it', () => {
  const op = { id: 'op_a', kind: 'move', state: 'running', phase: 'stopped', desktop_id: 'dsk_a', copied_bytes: null, total_bytes: null } as unknown as AdminOperation;
  const source = { ...host(0, 0, 0), id: 'host_s', state: 'down', last_heartbeat_at: new Date(Date.now() - 7_000).toISOString() } as AdminHost;
  const target = { ...host(0, 0, 0), id: 'host_t', state: 'ready', last_heartbeat_at: new Date().toISOString() } as AdminHost;
  expect(moveLine(op, [source, target])).toMatch(/^moving dsk_a: stopped; host host_s is down \(last heard [678]\.\d s ago\): the move waits for its agent$/);
  expect(moveLine(op, [target])).toBe('moving dsk_a: stopped');
});

it('says how many desktops a finished drain moved, in words that fit the count', () => {
  expect(describeDrain(host(1, 0, 0, 'drained'))).toMatch(/^host_a drained: 1 desktop moved \(1\.0 MiB\)/);
  expect(describeDrain(host(3, 0, 0, 'drained'))).toMatch(/^host_a drained: 3 desktops moved/);
});

it('says how long a finished drain took, by the drain\'s own times', () => {
  const done = host(4, 0, 0, 'drained');
  done.drain = { ...done.drain!, finished_at: new Date(2_400).toISOString() };
  expect(describeDrain(done)).toMatch(/^host_a drained in 2\.4 s: 4 desktops moved/);
  done.drain = { ...done.drain, finished_at: null };
  expect(describeDrain(done)).toMatch(/^host_a drained: 4 desktops moved/);
});

it('says where a move went, what it copied, and how long an awake desktop was down', () => {
  const op = (state: string, result: Record<string, unknown> | null, error: { code: string; message: string } | null = null) => ({
    id: 'op_a', kind: 'move', state, desktop_id: 'dsk_a', source_host_id: 'host_a', target_host_id: 'host_b',
    total_bytes: 3 * 1024 * 1024, copied_bytes: 3 * 1024 * 1024, result, error,
  }) as unknown as AdminOperation;
  expect(describeMove(op('succeeded', { downtime_ms: 312, was_awake: true }))).toBe('moved dsk_a from host_a to host_b (3.0 MiB, down 312 ms)');
  // A hibernated desktop was never up: no downtime to tell.
  expect(describeMove(op('succeeded', { downtime_ms: null, was_awake: false }))).toBe('moved dsk_a from host_a to host_b (3.0 MiB)');
  expect(describeMove(op('failed', null, { code: 'no_capacity', message: 'no host has room' }))).toBe('move of dsk_a failed: no host has room');
});

it('asks again while the admin API cannot be reached or answers 5xx, says so once, and gives up after its patience', async () => {
  const refused = () => new CantoConnectionError('http://127.0.0.1:9/admin/v1/hosts/host_a', Object.assign(new Error('fetch failed'), { cause: { code: 'ECONNREFUSED' } }));
  const unavailable = () => Object.assign(Object.create(CantoProblem.prototype) as CantoProblem, { status: 503, message: 'leader changing' });
  const notes: string[] = [];
  let calls = 0;
  const answer = await readThrough(async () => {
    calls++;
    if (calls === 1) throw refused();
    if (calls === 2) throw unavailable();
    return 'host';
  }, (line) => notes.push(line), 'drain', 5_000, 1);
  expect([answer, calls]).toEqual(['host', 3]);
  expect(notes).toEqual([expect.stringMatching(/^the admin API did not answer \(cannot reach .*ECONNREFUSED\); asking again for up to 5 s: the drain goes on meanwhile$/)]);
  // Anything but an unreachable API is the command's answer at once.
  const notFound = Object.assign(Object.create(CantoProblem.prototype) as CantoProblem, { status: 404, message: 'host not found' });
  let tries = 0;
  await expect(readThrough(async () => {
    tries++;
    throw notFound;
  }, () => {}, 'drain', 5_000, 1)).rejects.toBe(notFound);
  expect(tries).toBe(1);
  // Past its patience, the last failure is the answer.
  await expect(readThrough(async () => Promise.reject(refused()), () => {}, 'move', 20, 5)).rejects.toBeInstanceOf(CantoConnectionError);
});
