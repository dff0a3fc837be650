/**
 * Fork end to end (docs/api.md §4.1 fork rules): the real scheduler and a real agent in-process on the
 * sandbox runtime with CRIU. A prepared desktop (a file on its disk, a process counting in its
 * memory, a setup script that ran once) is hibernated and forked three times; every fork wakes
 * with the file and the still-counting process, the copies diverge independently, the source
 * keeps its own state, and the forks outlive the source's destruction.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { startSandboxAgent, type SandboxAgent } from '../helpers/agent.js';
import { memorySnapshotsHere } from '../helpers/sandbox.js';

const isRoot = process.getuid?.() === 0;

describe.skipIf(!isRoot)('fork, end to end on the sandbox runtime', () => {
  let scheduler: TestScheduler;
  let agent: SandboxAgent;
  let key: string;
  let call: ReturnType<typeof api>;
  let snapshots: boolean;

  beforeAll(async () => {
    snapshots = await memorySnapshotsHere();
    scheduler = await startTestScheduler({ CANTO_OPERATION_DEADLINE_MS: '60000' });
    agent = await startSandboxAgent(scheduler.url);
    key = await mintKey(scheduler.databaseUrl, 'fork-e2e');
    call = api(scheduler.url, key);
  }, 60_000);

  afterAll(async () => {
    await agent?.stop();
    await scheduler?.close();
  }, 60_000);

  const exec = async (id: string, command: string) => {
    const res = await call('POST', `/v1/desktops/${id}/exec`, { command });
    expect(res.status, res.text).toBe(200);
    return res.json as { exit_code: number; stdout: string };
  };
  const readNote = async (id: string) =>
    (await fetch(`${scheduler.url}/v1/desktops/${id}/files/root/note.txt`, { headers: { authorization: `Bearer ${key}` } })).text();
  const writeNote = async (id: string, text: string) =>
    expect((await fetch(`${scheduler.url}/v1/desktops/${id}/files/root/note.txt`, { method: 'PUT', headers: { authorization: `Bearer ${key}` }, body: text })).status).toBe(204);
  const counter = async (id: string) => Number((await exec(id, 'cat /tmp/counter')).stdout.trim());
  const lifecycle = async (id: string, kind: 'wake' | 'hibernate' | 'destroy') => {
    const res = await call('POST', `/v1/desktops/${id}/${kind}?wait=true`);
    expect(res.status, `${kind} ${id}: ${res.text}`).toBe(200);
    return res.json;
  };

  it('forks a hibernated desktop into independent copies that keep its disk and its memory', async () => {
    const created = await call('POST', '/v1/desktops', { tier: 'small', setup_script: 'echo ran >> /root/setup-runs' });
    const source: string = created.json.id;
    await lifecycle(source, 'wake');
    await until(async () => (await exec(source, 'cat /root/setup-runs 2>/dev/null')).stdout === 'ran\n', 10_000, 'setup to run');
    await writeNote(source, 'from the source');
    // A process whose state lives in memory: a cold boot would lose it, a restore keeps counting.
    await exec(source, "setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.05; done' >/dev/null 2>&1 </dev/null &");
    await until(async () => (await counter(source)) > 3, 5_000, 'the counter to run');
    const hibernated = await lifecycle(source, 'hibernate');
    expect(hibernated.result.snapshot).toBe(snapshots);
    const forked = await call('POST', `/v1/desktops/${source}/fork?wait=true`, { count: 3, acknowledge_shared_state: true });
    expect(forked.status, forked.text).toBe(200);
    const forks: string[] = forked.json.result.desktop_ids;
    expect(forks).toHaveLength(3);

    for (const [i, id] of forks.entries()) {
      const woke = await lifecycle(id, 'wake');
      expect(woke.result.restored, `fork ${i} restored from memory`).toBe(snapshots);
      expect(await readNote(id)).toBe('from the source');
      if (snapshots) {
        const first = await counter(id);
        await until(async () => (await counter(id)) > first + 2, 5_000, `fork ${i}'s counter to keep counting`);
      }
      // Setup ran once, on the source; the fork's disk carries that run and it does not run again.
      expect((await exec(id, 'cat /root/setup-runs')).stdout).toBe('ran\n');
      await writeNote(id, `fork ${i}`);
    }
    for (const [i, id] of forks.entries()) expect(await readNote(id)).toBe(`fork ${i}`);

    // The source is untouched by its forks, and wakes into its own state.
    expect((await lifecycle(source, 'wake')).result.restored).toBe(snapshots);
    expect(await readNote(source)).toBe('from the source');
    if (snapshots) {
      const sourceCount = await counter(source);
      await until(async () => (await counter(source)) > sourceCount, 5_000, "the source's counter");
    }
    await writeNote(source, 'source moved on');
    expect(await readNote(forks[0]!)).toBe('fork 0');

    // Destroying the source does not break its forks: they hibernate and wake again.
    await lifecycle(source, 'destroy');
    for (const id of forks) await lifecycle(id, 'hibernate');
    for (const [i, id] of forks.entries()) {
      expect((await lifecycle(id, 'wake')).result.restored).toBe(snapshots);
      expect(await readNote(id)).toBe(`fork ${i}`);
    }
    // A fork can be forked in turn.
    await lifecycle(forks[0]!, 'hibernate');
    const again = await call('POST', `/v1/desktops/${forks[0]}/fork?wait=true`, { count: 1, acknowledge_shared_state: true });
    expect(again.status, again.text).toBe(200);
    const grandchild: string = again.json.result.desktop_ids[0];
    await lifecycle(grandchild, 'wake');
    expect(await readNote(grandchild)).toBe('fork 0');
    for (const id of [...forks, grandchild]) await lifecycle(id, 'destroy');
  }, 180_000);
});
