/**
 * Linking pre-copied files into an import (agent/src/runtime/sandbox/host/precopy-files.ts
 * `linkPrecopied`): only down plain directories to a regular file. A stream that left a symbolic
 * link in the pre-copy must not get a file of the host linked into a guest's disk.
 */
import { existsSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect, it } from 'vitest';
import { linkPrecopied } from '../../agent/src/runtime/sandbox/host/precopy-files.js';

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
