/**
 * Fork end to end (docs/api.md §4.1 fork rules): the real scheduler and a real agent in-process on the
 * sandbox runtime with CRIU. A prepared desktop (a file on its disk, a process counting in its
 * memory, a setup script that ran once) is hibernated and forked three times; every fork wakes
 * with the file and the still-counting process, the copies diverge independently, the source
 * keeps its own state, and the forks outlive the source's destruction. It drives the API through
 * the TypeScript SDK (sdk/), as a client would.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { startSandboxAgent, type SandboxAgent } from '../helpers/agent.js';
import { memorySnapshotsHere } from '../helpers/sandbox.js';
import { createCanto, type Canto } from '../../sdk/src/index.js';

const isRoot = process.getuid?.() === 0;

describe.skipIf(!isRoot)('fork, end to end on the sandbox runtime', () => {
  let scheduler: TestScheduler;
  let agent: SandboxAgent;
  let canto: Canto;
  let snapshots: boolean;

  beforeAll(async () => {
    snapshots = await memorySnapshotsHere();
    scheduler = await startTestScheduler({ CANTO_OPERATION_DEADLINE_MS: '60000' });
    agent = await startSandboxAgent(scheduler.url);
    canto = createCanto({ baseUrl: scheduler.url, apiKey: await mintKey(scheduler.databaseUrl, 'fork-e2e') });
  }, 60_000);

  afterAll(async () => {
    await agent?.stop();
    await scheduler?.close();
  }, 60_000);

  const exec = (id: string, command: string) => canto.exec(id, command);
  const readNote = async (id: string) => new TextDecoder().decode(await canto.files.readBytes(id, 'root/note.txt'));
  const writeNote = (id: string, text: string) => canto.files.upload(id, 'root/note.txt', text);
  const counter = async (id: string) => Number((await exec(id, 'cat /tmp/counter')).stdout.trim());
  /** The settled operation; a failed one throws. */
  const lifecycle = (id: string, kind: 'wake' | 'hibernate' | 'destroy') => canto[kind](id, { wait: true });
  const fork = async (id: string, count: number) => {
    const op = await canto.fork(id, { count, acknowledge_shared_state: true }, { wait: true });
    return op.result!.desktop_ids as string[];
  };

  it('forks a hibernated desktop into independent copies that keep its disk and its memory', async () => {
    const source = (await canto.createDesktop({ tier: 'small', setup_script: 'echo ran >> /root/setup-runs' })).id;
    await lifecycle(source, 'wake');
    await until(async () => (await exec(source, 'cat /root/setup-runs 2>/dev/null')).stdout === 'ran\n', 10_000, 'setup to run');
    await writeNote(source, 'from the source');
    // A process whose state lives in memory: a cold boot would lose it, a restore keeps counting.
    await exec(source, "setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.05; done' >/dev/null 2>&1 </dev/null &");
    await until(async () => (await counter(source)) > 3, 5_000, 'the counter to run');
    const hibernated = await lifecycle(source, 'hibernate');
    expect(hibernated.result?.snapshot).toBe(snapshots);
    const forks = await fork(source, 3);
    expect(forks).toHaveLength(3);

    for (const [i, id] of forks.entries()) {
      const woke = await lifecycle(id, 'wake');
      expect(woke.result?.restored, `fork ${i} restored from memory`).toBe(snapshots);
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
    expect((await lifecycle(source, 'wake')).result?.restored).toBe(snapshots);
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
      expect((await lifecycle(id, 'wake')).result?.restored).toBe(snapshots);
      expect(await readNote(id)).toBe(`fork ${i}`);
    }
    // A fork can be forked in turn.
    await lifecycle(forks[0]!, 'hibernate');
    const [grandchild] = await fork(forks[0]!, 1);
    await lifecycle(grandchild!, 'wake');
    expect(await readNote(grandchild!)).toBe('fork 0');
    for (const id of [...forks, grandchild!]) await lifecycle(id, 'destroy');
  }, 180_000);
});
