/**
 * A desktop forked again and again stands on ever more layers, and an overlay's mount options
 * hold every layer's path within one page: past about sixty here the desktop and its newest forks
 * could never be mounted again. A freeze at MAX_CHAIN layers now flattens the desktop's disk into
 * one layer (agent/src/runtime/sandbox/host/layers.ts `flatten`): the same files, contents,
 * deletions, modes and hard links, on one layer; a fork made before keeps the chain it stood on.
 * Real overlays on this disk, no guest. Needs root.
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmod, link, lstat, mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import { createFork, freeze, layersDir, MAX_CHAIN, mountDisk, releaseDisk } from '../../agent/src/runtime/sandbox/host/layers.js';
import { parseMountTable } from '../../agent/src/runtime/sandbox/host/mount-table.js';
import { desktopPaths } from '../../agent/src/runtime/sandbox/host/layout.js';
import { isRoot } from '../helpers/sandbox.js';

/** Every entry under `dir`: a file's mode, link count and sha256, a directory's mode. */
async function tree(dir: string, at = ''): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const name of (await readdir(join(dir, at))).sort()) {
    const path = join(at, name);
    const st = await lstat(join(dir, path));
    if (st.isDirectory()) {
      out[path] = `dir ${(st.mode & 0o7777).toString(8)}`;
      Object.assign(out, await tree(dir, path));
    } else {
      const sum = createHash('sha256').update(await readFile(join(dir, path))).digest('hex').slice(0, 16);
      out[path] = `file ${(st.mode & 0o7777).toString(8)} ${st.nlink} ${sum}`;
    }
  }
  return out;
}

describe.skipIf(!isRoot)('a desktop forked past the longest chain an overlay can mount', () => {
  let stateDir: string;
  const source = () => desktopPaths(stateDir, sourceId);
  const fork = () => desktopPaths(stateDir, forkId);
  const sourceId = newId('desktop');
  const forkId = newId('desktop');

  beforeAll(async () => {
    stateDir = await mkdtemp(join(tmpdir(), 'canto-flatten-'));
  });

  afterAll(async () => {
    for (const p of [source(), fork()]) await releaseDisk(p).catch(() => undefined);
    await rm(stateDir, { recursive: true, force: true });
  });

  it('is flattened into one layer at its next freeze, its files unchanged, its earlier forks too', async () => {
    const paths = source();
    const root = join(paths.disk, 'root');
    await mkdir(root, { recursive: true });
    await writeFile(join(root, 'first'), 'first');
    await writeFile(join(root, 'gone'), 'deleted later');
    await writeFile(join(root, 'secret'), 'mode 600');
    await chmod(join(root, 'secret'), 0o600);
    let chain = await freeze(stateDir, paths);
    for (let i = 1; chain.lower.length < MAX_CHAIN; i++) {
      await mountDisk(stateDir, paths);
      await writeFile(join(root, `n${i}`), String(i));
      if (i === 3) await rm(join(root, 'gone'));
      if (i === 5) await writeFile(join(root, 'first'), 'first, changed');
      if (i === 7) await link(join(root, 'n7'), join(root, 'n7-again'));
      chain = await freeze(stateDir, paths);
    }
    await createFork(paths, fork(), chain, []);
    await mountDisk(stateDir, fork());
    const forkBefore = await tree(fork().disk);

    await mountDisk(stateDir, paths);
    await writeFile(join(root, 'last'), 'after the fork');
    const before = await tree(paths.disk);
    expect(before).toMatchObject({ 'root/first': expect.stringContaining('file 644 1'), 'root/secret': expect.stringContaining('file 600'), 'root/n7-again': expect.stringContaining(' 2 ') });
    expect(before['root/gone']).toBeUndefined();

    chain = await freeze(stateDir, paths);
    expect(chain.lower).toHaveLength(1);
    await mountDisk(stateDir, paths);
    expect(await tree(paths.disk)).toEqual(before);
    // Written after the flatten: on the new chain's own upper layer.
    await writeFile(join(root, 'next'), 'next');
    expect(await readFile(join(root, 'next'), 'utf8')).toBe('next');
    // The fork stands on the long chain still, which is kept for it.
    await releaseDisk(fork());
    await mountDisk(stateDir, fork());
    expect(await tree(fork().disk)).toEqual(forkBefore);
  }, 120_000);

  it('recovers a flatten its agent was killed in without leaving the old overlay mounted under the new chain', async () => {
    const paths = desktopPaths(stateDir, newId('desktop'));
    await mkdir(join(paths.disk, 'root'), { recursive: true });
    await writeFile(join(paths.disk, 'root', 'a'), 'a');
    await freeze(stateDir, paths);
    await mountDisk(stateDir, paths);
    await writeFile(join(paths.disk, 'root', 'b'), 'b');
    await freeze(stateDir, paths);
    await mountDisk(stateDir, paths);
    // Killed with the flattened layer in the store and the new chain written, the old overlay mounted.
    const layer = newId('layer');
    await mkdir(join(layersDir(stateDir), layer));
    execFileSync('cp', ['-a', `${paths.disk}/.`, join(layersDir(stateDir), layer)]);
    await writeFile(join(paths.dir, 'layers.next.json'), JSON.stringify({ lower: [layer] }));
    await mountDisk(stateDir, paths);
    const mounts = parseMountTable(await readFile('/proc/self/mountinfo', 'utf8')).filter((m) => m.mountPoint === paths.disk);
    expect(mounts).toHaveLength(1);
    expect(mounts[0]!.superOptions).toContain(`lowerdir=${join(layersDir(stateDir), layer)}`);
    expect(await readFile(join(paths.disk, 'root', 'b'), 'utf8')).toBe('b');
    await releaseDisk(paths);
  });
});
