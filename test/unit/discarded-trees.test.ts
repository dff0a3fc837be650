/**
 * A destroyed desktop's files (host/discarded.ts): out of the desktops directory by the time the
 * destroy answers, removed behind it, and what an earlier agent left is removed at the next start.
 */
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { collectUnusedLayers, discardedDir, discardsSettled, discardTree, sweepDiscarded } from '../../agent/src/runtime/sandbox/host/discarded.js';
import { until } from '../helpers/wait.js';

let stateDir: string;

beforeEach(async () => {
  stateDir = await mkdtemp(join(tmpdir(), 'canto-discarded-'));
});

afterEach(async () => {
  await rm(stateDir, { recursive: true, force: true });
});

/** A desktop directory with a few files in nested directories. */
async function desktopDir(id: string): Promise<string> {
  const dir = join(stateDir, 'desktops', id);
  await mkdir(join(dir, 'upper', 'root', 'deep'), { recursive: true });
  await writeFile(join(dir, 'upper', 'root', 'deep', 'data.bin'), Buffer.alloc(256 * 1024, 7));
  await writeFile(join(dir, 'layers.json'), '[]');
  return dir;
}

const failures: unknown[] = [];
const failed = (err: unknown) => failures.push(err);

describe('discardTree', () => {
  it('moves the directory out of the way before it answers, and removes it afterwards', async () => {
    const dir = await desktopDir('dsk_a');
    await discardTree(stateDir, dir, failed);
    expect(existsSync(dir)).toBe(false);
    // The removal has not run yet: it waits for the next turn of the event loop.
    const waiting = await readdir(discardedDir(stateDir));
    expect(waiting).toHaveLength(1);
    expect(waiting[0]).toMatch(/^dsk_a\.\d+-[0-9a-f]{6}$/);
    await until(async () => (await readdir(discardedDir(stateDir))).length === 0, 5_000, 'the removal');
    expect(failures).toEqual([]);
  });

  it('takes a restored snapshot out of its desktop under the desktop\'s name, and leaves the rest', async () => {
    const dir = await desktopDir('dsk_f');
    await mkdir(join(dir, 'snapshot'));
    for (let i = 0; i < 50; i++) await writeFile(join(dir, 'snapshot', `pages-${i}.img`), 'x');
    await mkdir(join(dir, 'snapshot.failed-1'));
    await discardTree(stateDir, join(dir, 'snapshot'), failed, 'dsk_f.snapshot');
    expect((await readdir(discardedDir(stateDir)))[0]).toMatch(/^dsk_f\.snapshot\.\d+-[0-9a-f]{6}$/);
    await sweepDiscarded(stateDir);
    expect(await readdir(discardedDir(stateDir))).toEqual([]);
    // Images set aside after a failed restore are the operator's; the desktop itself stays.
    expect((await readdir(dir)).sort()).toEqual(['layers.json', 'snapshot.failed-1', 'upper']);
    expect(failures).toEqual([]);
  });

  it('takes a directory that is not there as already gone', async () => {
    await discardTree(stateDir, join(stateDir, 'desktops', 'dsk_missing'), failed);
    await sweepDiscarded(stateDir);
    expect(await readdir(discardedDir(stateDir))).toEqual([]);
    expect(failures).toEqual([]);
  });

  it('removes every directory discarded while a removal may run, the same id twice included', async () => {
    const dirs = await Promise.all(['dsk_b', 'dsk_c', 'dsk_d'].map(desktopDir));
    for (const dir of dirs) await discardTree(stateDir, dir, failed);
    // The same desktop again (a move back here, destroyed again) before the first removal ran.
    const again = await desktopDir('dsk_b');
    await discardTree(stateDir, again, failed);
    expect(existsSync(again)).toBe(false);
    await sweepDiscarded(stateDir);
    expect(await readdir(discardedDir(stateDir))).toEqual([]);
    expect(failures).toEqual([]);
  });
});

describe('sweepDiscarded', () => {
  it('removes what an agent that stopped mid-removal left behind', async () => {
    const left = join(discardedDir(stateDir), 'dsk_e.1700000000000-abcdef');
    await mkdir(join(left, 'upper', 'root'), { recursive: true });
    await writeFile(join(left, 'upper', 'root', 'file'), 'x');
    await sweepDiscarded(stateDir);
    expect(await readdir(discardedDir(stateDir))).toEqual([]);
  });

  it('runs once at a time per state directory: a sweep asked for while one runs is that one', async () => {
    for (const n of [1, 2, 3]) await mkdir(join(discardedDir(stateDir), `dsk_${n}.1700000000000-abcdef`, 'upper'), { recursive: true });
    const first = sweepDiscarded(stateDir);
    expect(sweepDiscarded(stateDir)).toBe(first);
    await first;
    expect(await readdir(discardedDir(stateDir))).toEqual([]);
    expect(sweepDiscarded(stateDir)).not.toBe(first);
  });

  it('answers at once on a state directory that never discarded anything', async () => {
    await sweepDiscarded(stateDir);
    expect(existsSync(discardedDir(stateDir))).toBe(false);
  });
});

describe('collectUnusedLayers', () => {
  it('removes the layers no desktop stands on once the discarded directories are gone, and says how many', async () => {
    const logged: string[] = [];
    const log = (msg: string, fields?: object) => void logged.push(`${msg} ${JSON.stringify(fields)}`);
    for (const layer of ['lay_kept', 'lay_free']) await mkdir(join(stateDir, 'layers', layer, 'root'), { recursive: true });
    const fork = await desktopDir('dsk_fork');
    await writeFile(join(fork, 'layers.json'), JSON.stringify({ lower: ['lay_kept'] }));
    await discardTree(stateDir, await desktopDir('dsk_gone'), failed);
    // A second request while the first runs is folded into it: the layer is removed, and told, once.
    void collectUnusedLayers(stateDir, log, { desktopId: 'dsk_gone' });
    void collectUnusedLayers(stateDir, log, { desktopId: 'dsk_gone' });
    await discardsSettled(stateDir);
    expect(await readdir(discardedDir(stateDir))).toEqual([]);
    expect(await readdir(join(stateDir, 'layers'))).toEqual(['lay_kept']);
    expect(logged).toEqual(['disk layers no desktop stands on any more were removed {"desktopId":"dsk_gone","count":1}']);
    expect(failures).toEqual([]);
  });

  // chattr's immutable flag needs root (CAP_LINUX_IMMUTABLE) and a file system that has it.
  it.skipIf(process.getuid?.() !== 0)('passes over an entry it cannot remove: the others and the unused layers still go, and it says why', async () => {
    const logged: string[] = [];
    const log = (msg: string, fields?: object, level?: 'warn') => void logged.push(`${level ?? 'info'}: ${msg} ${JSON.stringify(fields)}`);
    await mkdir(join(stateDir, 'layers', 'lay_free', 'root'), { recursive: true });
    const stuck = join(discardedDir(stateDir), 'dsk_stuck.1-aaaaaa');
    await mkdir(stuck, { recursive: true });
    await writeFile(join(stuck, 'immutable'), 'x');
    execFileSync('chattr', ['+i', join(stuck, 'immutable')]);
    try {
      await mkdir(join(discardedDir(stateDir), 'dsk_other.1-bbbbbb', 'root'), { recursive: true });
      await collectUnusedLayers(stateDir, log);
      expect(await readdir(discardedDir(stateDir))).toEqual(['dsk_stuck.1-aaaaaa']);
      expect(existsSync(join(stateDir, 'layers', 'lay_free'))).toBe(false);
      expect(logged).toEqual([
        'info: disk layers no desktop stands on any more were removed {"count":1}',
        expect.stringMatching(/^warn: could not remove destroyed desktops' files or unused layers .*1 discarded entry could not be removed \(dsk_stuck/),
      ]);
    } finally {
      execFileSync('chattr', ['-i', join(stuck, 'immutable')]);
    }
  });
});
