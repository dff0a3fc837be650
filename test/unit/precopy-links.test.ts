/**
 * Pre-copied files are taken only down plain directories to a regular file
 * (agent/src/runtime/sandbox/host/precopy-files.ts): on the target, a stream that left a symbolic
 * link in the pre-copy must not get a file of the host linked into a guest's disk; on the source,
 * a file a guest now reaches through a link it put in its directory's place counts as changed
 * (the target could not put it under that link, and would fail the import on every try).
 */
import { existsSync, mkdirSync, mkdtempSync, renameSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect, it } from 'vitest';
import { identify, linkPrecopied } from '../../agent/src/runtime/sandbox/host/precopy-files.js';

it('links no pre-copied path that leads through a symbolic link (a file of the host would land in the guest)', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'canto-prelinks-'));
  try {
    const [pre, dest, outside] = [join(dir, 'pre'), join(dir, 'dest'), join(dir, 'outside')];
    mkdirSync(join(pre, 'disk', 'root'), { recursive: true });
    mkdirSync(outside);
    mkdirSync(dest);
    writeFileSync(join(outside, 'secret'), 'HOST FILE');
    // What a stream could leave: a directory that is a link out, and a file that is one.
    symlinkSync(outside, join(pre, 'disk', 'root', 'docs'));
    symlinkSync(join(outside, 'secret'), join(pre, 'disk', 'root', 'notes'));
    writeFileSync(join(pre, 'disk', 'root', 'plain'), 'guest file');
    for (const path of ['disk/root/docs/secret', 'disk/root/notes']) {
      await expect(linkPrecopied(pre, dest, [path])).rejects.toMatchObject({ code: 'runtime_error', retryable: false });
      expect(existsSync(join(dest, path))).toBe(false);
    }
    await linkPrecopied(pre, dest, ['disk/root/plain']);
    expect(existsSync(join(dest, 'disk', 'root', 'plain'))).toBe(true);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

it('counts a pre-copied file reached through a link a guest put in place of its directory as changed', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'canto-preident-'));
  try {
    mkdirSync(join(dir, 'disk', 'root', 'a'), { recursive: true });
    writeFileSync(join(dir, 'disk', 'root', 'a', 'f'), 'x'.repeat(100_000));
    const [before] = await identify(dir, ['disk/root/a/f']);
    expect(before).not.toBeNull();
    // The guest moves the directory and leaves a link to it in its place: the same file (inode) behind.
    renameSync(join(dir, 'disk', 'root', 'a'), join(dir, 'disk', 'root', 'b'));
    symlinkSync(join(dir, 'disk', 'root', 'b'), join(dir, 'disk', 'root', 'a'));
    expect(await identify(dir, ['disk/root/a/f', 'disk/root/b/f'])).toEqual([null, before]);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
