/**
 * The pre-copy's scan of a running desktop's writable layer (precopy-files.ts) is bounded: a
 * directory holding more names than the scan has left to look at is not listed whole and sorted
 * on the agent's one thread, but left, as a whole, to the copy after the stop.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, expect, it } from 'vitest';
import { scanCold } from '../../agent/src/runtime/sandbox/host/precopy-files.js';

const dir = mkdtempSync(join(tmpdir(), 'canto-precopy-scan-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Options under which every file here is cold and big enough. */
const everything = { coldMs: 0, minBytes: 1, now: Date.now() + 60_000, mapped: { inodes: new Set<string>(), paths: new Set<string>() } };

function files(sub: string, n: number): void {
  mkdirSync(join(dir, 'disk', sub), { recursive: true });
  for (let i = 0; i < n; i++) writeFileSync(join(dir, 'disk', sub, `f${String(i).padStart(3, '0')}`), 'x');
}

it('leaves a directory larger than what the scan has left to the stop, whole, and picks what came before it', async () => {
  files('a-small', 3);
  files('b-huge', 40);
  const all = await scanCold(dir, ['disk'], everything);
  expect(all).toHaveLength(43);
  const bounded = (await scanCold(dir, ['disk'], { ...everything, maxVisited: 20 })).map((e) => e.path);
  expect(bounded).toEqual(['disk/a-small/f000', 'disk/a-small/f001', 'disk/a-small/f002']);
});
