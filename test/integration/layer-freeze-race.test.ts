/**
 * A layer collection and a fork's freeze on one host (agent/src/runtime/sandbox/host/layers.ts):
 * the freeze takes the layer store's lock as a collection does. Without it, a collection that had
 * read the desktop's chain files before the freeze wrote its new chain, and listed the store after
 * the freeze renamed the desktop's disk into it, removed the new layer: the source's whole disk at
 * its first fork, gone from under the source and every fork. Plain directories on this disk; the
 * collection scans thousands of other desktops, and each freeze comes at another point of it.
 */
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import { collectLayers, freeze, layersDir } from '../../agent/src/runtime/sandbox/host/layers.js';
import { desktopPaths, desktopsDir } from '../../agent/src/runtime/sandbox/host/layout.js';

/** Desktops the collection scans besides the one frozen. */
const OTHERS = 3000;
const TRIALS = 12;

let stateDir: string;
beforeAll(async () => {
  stateDir = await mkdtemp(join(tmpdir(), 'canto-freeze-race-'));
  for (let i = 0; i < OTHERS; i++) await mkdir(join(desktopsDir(stateDir), newId('desktop')), { recursive: true });
});
afterAll(async () => {
  if (stateDir) await rm(stateDir, { recursive: true, force: true });
});

it('never collects the layer a freeze is making', async () => {
  const started = performance.now();
  await collectLayers(stateDir, desktopsDir(stateDir));
  const scanMs = performance.now() - started;
  for (let trial = 0; trial < TRIALS; trial++) {
    const paths = desktopPaths(stateDir, newId('desktop'));
    await mkdir(join(paths.disk, 'root'), { recursive: true });
    await writeFile(join(paths.disk, 'root', 'note'), `trial ${trial}`);
    const collecting = collectLayers(stateDir, desktopsDir(stateDir));
    // Somewhere in the collection's scan: a fifth of the way in, two fifths, …
    await sleep((scanMs * ((trial % 4) + 1)) / 5);
    const chain = await freeze(stateDir, paths);
    await collecting;
    expect(await readFile(join(layersDir(stateDir), chain.lower[0]!, 'root', 'note'), 'utf8').catch(() => 'collected')).toBe(`trial ${trial}`);
  }
}, 120_000);
