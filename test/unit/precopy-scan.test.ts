/**
 * The pre-copy's scan of a running desktop's writable layer (precopy-files.ts) is bounded: a
 * directory holding more names than the scan has left to look at is not listed whole and sorted
 * on the agent's one thread, but left, as a whole, to the copy after the stop. Names are taken in
 * the byte order of their UTF-8, tar's, also where JavaScript's string order differs from it.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, expect, it } from 'vitest';
import { inByteOrder, scanCold } from '../../agent/src/runtime/sandbox/host/precopy-files.js';

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

it('orders names by their UTF-8 bytes, as tar lists them, whatever characters they hold', () => {
  const bytewise = (names: string[]) => [...names].sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
  // U+FF01 encodes below an emoji in UTF-8 (EF… against F0…), above it in UTF-16 (FF01 against D83D).
  const mixed = ['\u{1F600}', '\uFF01', 'a', '\u00E9', 'Z', '\u{10000}', '\uE000', 'a\u{1F600}', 'a\uFFFF'];
  expect(inByteOrder(mixed)).toEqual(['Z', 'a', 'a\uFFFF', 'a\u{1F600}', '\u00E9', '\uE000', '\uFF01', '\u{10000}', '\u{1F600}']);
  expect(inByteOrder(mixed)).toEqual(bytewise(mixed));
  const plain = Array.from({ length: 2_000 }, (_, i) => `${String.fromCharCode(32 + ((i * 7919) % 0xd700))}-${i}`);
  expect(inByteOrder(plain)).toEqual(bytewise(plain));
});
