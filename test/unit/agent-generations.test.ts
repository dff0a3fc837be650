import { watch } from 'node:fs';
import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { GENERATIONS_FILE, GenerationStore } from '../../agent/src/generations.js';
import { loadHostIdentity } from '../../agent/src/host-identity.js';
import { AgentFailure } from '../../shared/src/protocol.js';
import { isId } from '../../shared/src/ids.js';

let dir: string;

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), 'canto-gen-'));
});

afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

async function expectStale(promise: Promise<unknown>): Promise<void> {
  const err = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(AgentFailure);
  expect((err as AgentFailure).code).toBe('stale_generation');
  expect((err as AgentFailure).retryable).toBe(false);
}

describe('GenerationStore', () => {
  it('records the highest generation and refuses older ones', async () => {
    const store = await GenerationStore.open(dir);
    await store.check('dsk_a', 3);
    expect(store.get('dsk_a')).toBe(3);
    await store.check('dsk_a', 3); // the same generation again: an idempotent replay
    await store.check('dsk_a', 5);
    expect(store.get('dsk_a')).toBe(5);
    await expectStale(store.check('dsk_a', 4));
    expect(store.get('dsk_a')).toBe(5);
    await store.check('dsk_b', 1); // desktops are fenced independently
    expect(store.get('dsk_b')).toBe(1);
  });

  it('survives a restart', async () => {
    const first = await GenerationStore.open(dir);
    await first.check('dsk_a', 7);
    const second = await GenerationStore.open(dir);
    expect(second.get('dsk_a')).toBe(7);
    await expectStale(second.check('dsk_a', 6));
  });

  it('writes atomically, leaving no temporary files', async () => {
    const store = await GenerationStore.open(dir);
    await Promise.all(Array.from({ length: 20 }, (_, i) => store.check(`dsk_${i}`, i)));
    expect(await readdir(dir)).toEqual([GENERATIONS_FILE]);
    const doc = JSON.parse(await readFile(join(dir, GENERATIONS_FILE), 'utf8')) as {
      desktops: Record<string, { generation: number }>;
    };
    expect(Object.keys(doc.desktops)).toHaveLength(20);
    expect(doc.desktops['dsk_19']?.generation).toBe(19);
  });

  it('commits the commands that come while it writes together, in one more write', async () => {
    const store = await GenerationStore.open(dir);
    const writes: string[] = [];
    const watcher = watch(dir, (_event, name) => {
      if (name === GENERATIONS_FILE) writes.push(name);
    });
    try {
      await Promise.all(Array.from({ length: 20 }, (_, i) => store.check(`dsk_${i}`, 3)));
      await new Promise((resolve) => setTimeout(resolve, 100));
    } finally {
      watcher.close();
    }
    // The first command's write, then one for the nineteen that came meanwhile (one each before).
    expect(writes.length).toBeGreaterThanOrEqual(1);
    expect(writes.length).toBeLessThanOrEqual(2);
    const reopened = await GenerationStore.open(dir);
    for (let i = 0; i < 20; i++) expect(reopened.get(`dsk_${i}`)).toBe(3);
  });

  it('applies a group in the order its commands came, refusing one without failing the others', async () => {
    const store = await GenerationStore.open(dir);
    await store.check('dsk_a', 1);
    const newer = store.check('dsk_a', 5);
    const older = store.check('dsk_a', 4);
    const other = store.check('dsk_b', 2);
    await newer;
    await expectStale(older);
    await other;
    expect([store.get('dsk_a'), store.get('dsk_b')]).toEqual([5, 2]);
  });

  it('fails every command of a group whose write fails, and changes nothing', async () => {
    const store = await GenerationStore.open(dir);
    await store.check('dsk_a', 1);
    await rm(dir, { recursive: true });
    const results = await Promise.allSettled([store.check('dsk_a', 2), store.check('dsk_b', 1), store.check('dsk_a', 1)]);
    expect(results.map((r) => r.status)).toEqual(['rejected', 'rejected', 'rejected']);
    expect([store.get('dsk_a'), store.get('dsk_b')]).toEqual([1, undefined]);
    // The disk is back: the next command is recorded.
    await mkdir(dir);
    await store.check('dsk_a', 2);
    expect(store.get('dsk_a')).toBe(2);
  });

  it('keeps a tombstone after destroy so old commands cannot resurrect the desktop', async () => {
    const store = await GenerationStore.open(dir);
    await store.check('dsk_a', 4);
    await store.check('dsk_a', 5, 'destroy');
    await store.forget('dsk_a');
    expect(store.get('dsk_a')).toBeUndefined();
    expect(store.isDestroyed('dsk_a')).toBe(true);

    await expectStale(store.check('dsk_a', 4)); // a start from before the destroy
    await expectStale(store.check('dsk_a', 5)); // anything but destroy at the tombstone's generation
    await store.check('dsk_a', 5, 'destroy'); // a repeated destroy is idempotent

    const reopened = await GenerationStore.open(dir);
    expect(reopened.isDestroyed('dsk_a')).toBe(true);
    await expectStale(reopened.check('dsk_a', 5));

    // Only the scheduler can mint a newer generation: the desktop was placed here again.
    await reopened.check('dsk_a', 6);
    expect(reopened.get('dsk_a')).toBe(6);
    expect(reopened.isDestroyed('dsk_a')).toBe(false);
  });

  it('drops tombstones after their time to live', async () => {
    let now = 1_000_000;
    const store = await GenerationStore.open(dir, { now: () => now });
    await store.check('dsk_a', 2);
    await store.forget('dsk_a');
    now += 1000;
    expect((await GenerationStore.open(dir, { now: () => now, tombstoneTtlMs: 5000 })).isDestroyed('dsk_a')).toBe(true);
    now += 10_000;
    expect((await GenerationStore.open(dir, { now: () => now, tombstoneTtlMs: 5000 })).isDestroyed('dsk_a')).toBe(false);
  });

  it('refuses to start from a damaged file instead of switching fencing off', async () => {
    await writeFile(join(dir, GENERATIONS_FILE), '{"version": 1, "desktops": {"dsk_a": {');
    await expect(GenerationStore.open(dir)).rejects.toThrow(/unreadable/);
  });
});

describe('host identity', () => {
  it('keeps the host id across restarts and mints a fresh instance id', async () => {
    const first = await loadHostIdentity(dir);
    const second = await loadHostIdentity(dir);
    expect(isId('host', first.hostId)).toBe(true);
    expect(second.hostId).toBe(first.hostId);
    expect(second.agentInstanceId).not.toBe(first.agentInstanceId);
  });

  it('refuses a host-id file that does not hold a host id', async () => {
    await writeFile(join(dir, 'host-id'), 'garbage\n');
    await expect(loadHostIdentity(dir)).rejects.toThrow(/does not hold a host id/);
  });
});
