/**
 * A stopped desktop's framebuffer file without its zeros (agent/src/runtime/sandbox/host/sparse.ts):
 * the two file operations on real files, then a real desktop whose 16 MiB framebuffer file holds
 * a 1024x768 screen, hibernated, forked and woken, showing the same screen each time.
 */
import { createHash } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import { chmod, lstat, mkdtemp, open, readdir, readFile, rm, stat, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import { FRAMEBUFFER_FILE } from '../../agent/src/runtime/sandbox/computer-use/screenshot.js';
import { desktopPaths } from '../../agent/src/runtime/sandbox/host/layout.js';
import { compactFile, copySparse, worthCompacting } from '../../agent/src/runtime/sandbox/host/sparse.js';
import { createSandboxDriver, type SandboxDriver } from '../../agent/src/runtime/sandbox/index.js';
import { destroyLeftDesktops, isRoot, memorySnapshotsHere } from '../helpers/sandbox.js';
import { until } from '../helpers/scheduler.js';

const MiB = 1 << 20;
const sha256 = async (file: string) => createHash('sha256').update(await readFile(file)).digest('hex');
/** Bytes the file system holds for the file. */
const allocated = async (file: string) => (await stat(file)).blocks * 512;

describe('framebuffer files without their zeros', () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'canto-sparse-'));
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('keep their bytes while their zero blocks become holes, and copies write only the rest', async () => {
    const file = join(dir, 'fb');
    // 8 MiB + 100 bytes of zeros written out, with data in a few places (one straddling blocks,
    // one in the short tail).
    const handle = await open(file, 'w');
    const size = 8 * MiB + 100;
    for (let at = 0; at < size; at += MiB) await handle.write(Buffer.alloc(Math.min(MiB, size - at)), 0, Math.min(MiB, size - at), at);
    await handle.write(Buffer.from('top of the screen'), 0, 17, 0);
    await handle.write(Buffer.alloc(6000, 7), 0, 6000, 3 * MiB - 3000);
    await handle.write(Buffer.from('tail'), 0, 4, size - 4);
    await handle.close();
    await chmod(file, 0o640);
    const before = await sha256(file);
    expect(await allocated(file)).toBeGreaterThanOrEqual(8 * MiB);
    expect(await worthCompacting(file)).toBe(true);

    // What a crash in the middle of an earlier compaction left.
    await writeFile(`${file}.sparse`, 'half a copy');
    await compactFile(file);
    expect(await readdir(dir)).toEqual(['fb']);
    expect(await sha256(file)).toBe(before);
    expect((await stat(file)).size).toBe(size);
    expect(await allocated(file)).toBeLessThan(64 * 1024);
    expect(await worthCompacting(file)).toBe(false);

    const copy = join(dir, 'copy');
    await copySparse(file, copy);
    expect(await sha256(copy)).toBe(before);
    expect((await stat(copy)).size).toBe(size);
    expect((await stat(copy)).mode & 0o777).toBe(0o640);
    expect(await allocated(copy)).toBeLessThan(64 * 1024);
    // Never over a file that exists.
    await expect(copySparse(file, copy)).rejects.toThrow(/EEXIST/);
  });

  it('copy and compact only a regular file reached without a symlink (the guest writes that directory)', async () => {
    const secret = join(dir, 'host-secret');
    await writeFile(secret, 'TOP-SECRET');
    const link = join(dir, 'fb-link');
    await symlink(secret, link);
    await expect(copySparse(link, join(dir, 'stolen'))).rejects.toThrow(/ELOOP/);
    expect(await worthCompacting(link)).toBe(false);
    await expect(compactFile(link)).rejects.toThrow(/ELOOP/);
    expect((await lstat(link)).isSymbolicLink()).toBe(true);
    // A fifo would hang a copy that waited for a writer.
    const fifo = join(dir, 'fb-fifo');
    execFileSync('mkfifo', [fifo]);
    await expect(copySparse(fifo, join(dir, 'from-fifo'))).rejects.toThrow(/not a regular file/);
    await expect(readdir(dir)).resolves.not.toContain('stolen');
  });
});

const snapshots = isRoot && (await memorySnapshotsHere());

describe.skipIf(!snapshots)("a hibernated desktop's framebuffer", () => {
  let base: string;
  let driver: SandboxDriver;
  beforeAll(async () => {
    base = await mkdtemp(join(tmpdir(), 'canto-fb-holes-'));
    driver = await createSandboxDriver({ stateDir: base });
  });
  afterAll(async () => {
    await driver?.close();
    await destroyLeftDesktops(base);
    await rm(base, { recursive: true, force: true });
  });

  const sh = async (id: string, command: string) => {
    const out = await driver.exec(id, { command, timeoutMs: 10_000, maxOutputBytes: MiB });
    expect(out.exitCode, out.stderr).toBe(0);
    return out.stdout.trim();
  };
  const screen = async (id: string) => (await driver.screenshot(id, { region: null, scalePercent: null, maxBytes: 64 * MiB })).png;
  const fbOf = (id: string) => join(desktopPaths(base, id).fb, FRAMEBUFFER_FILE);

  it('keeps only the screen on disk, and the desktop and its fork wake showing it', async () => {
    const id = newId('desktop');
    await driver.prepare(id, 'small');
    await driver.start({ desktopId: id, tier: 'small', firstBoot: null });
    // The whole 1024x768 screen red: 3 MiB of the 16 MiB file are not zeros, in 768 rows laid
    // out 2560 pixels apart (the largest screen's), so about 6 MiB of its 4 KiB blocks.
    await sh(id, 'xsetroot -solid "#ff0000"');
    const shown = await screen(id);
    const size = (await stat(fbOf(id))).size;
    expect(size).toBeGreaterThan(15 * MiB); // 2560x1600, 4 bytes a pixel
    expect(await allocated(fbOf(id))).toBeGreaterThanOrEqual(size - MiB);

    expect(await driver.hibernate(id)).toEqual({ snapshot: true });
    // Compacted right after the hibernate has answered.
    await until(async () => (await allocated(fbOf(id))) < 8 * MiB, 5_000, 'the framebuffer file compacted');
    expect((await stat(fbOf(id))).size).toBe(size);
    const content = await sha256(fbOf(id));
    expect(await readdir(desktopPaths(base, id).fb)).toEqual([FRAMEBUFFER_FILE]);

    const fork = newId('desktop');
    expect(await driver.fork(id, [fork])).toEqual({ snapshot: true });
    expect(await sha256(fbOf(fork))).toBe(content);
    expect(await allocated(fbOf(fork))).toBeLessThan(8 * MiB);

    // What a guest leaves beside its framebuffer (the directory is its /run/canto-fb) is not
    // copied by a fork: a link to a host file would be read as the host's root.
    await driver.start({ desktopId: id, tier: 'small', firstBoot: null });
    await sh(id, 'ln -s /proc/self/environ /run/canto-fb/environ && mkfifo /run/canto-fb/fifo');
    expect(await driver.hibernate(id)).toEqual({ snapshot: true });
    const second = newId('desktop');
    expect(await driver.fork(id, [second])).toEqual({ snapshot: true });
    expect(await readdir(desktopPaths(base, second).fb)).toEqual([FRAMEBUFFER_FILE]);
    await driver.destroy(second);

    for (const desktop of [id, fork]) {
      expect(await driver.start({ desktopId: desktop, tier: 'small', firstBoot: null })).toEqual({ restored: true });
      expect((await screen(desktop)).equals(shown)).toBe(true);
      // And the X server draws on as before.
      await sh(desktop, 'xsetroot -solid "#0000ff"');
      expect((await screen(desktop)).equals(shown)).toBe(false);
    }
  });

  it('leaves the file as it is when the desktop wakes right after its hibernate, compacts it at the next, and not again once restored', async () => {
    const id = newId('desktop');
    await driver.prepare(id, 'small');
    await driver.start({ desktopId: id, tier: 'small', firstBoot: null });
    expect(await driver.hibernate(id)).toEqual({ snapshot: true });
    // The wake stops the compaction just begun rather than wait for it.
    expect(await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).toEqual({ restored: true });
    expect(await readdir(desktopPaths(base, id).fb)).toEqual([FRAMEBUFFER_FILE]);
    expect(await allocated(fbOf(id))).toBeGreaterThan(15 * MiB);
    expect(await sh(id, 'xdotool getdisplaygeometry')).toBe('1024 768');

    expect(await driver.hibernate(id)).toEqual({ snapshot: true });
    await until(async () => (await allocated(fbOf(id))) < MiB, 5_000, 'the framebuffer file compacted');

    // Restored, the X server allocates only what it draws: the next hibernate finds nothing worth
    // reading 16 MiB for, and the file stays the one it was (a compaction writes a new one).
    expect(await driver.start({ desktopId: id, tier: 'small', firstBoot: null })).toEqual({ restored: true });
    const inode = (await stat(fbOf(id))).ino;
    expect(await driver.hibernate(id)).toEqual({ snapshot: true });
    // A fork waits for the desktop's mutex, which a compaction would hold.
    expect(await driver.fork(id, [newId('desktop')])).toEqual({ snapshot: true });
    expect((await stat(fbOf(id))).ino).toBe(inode);
    expect(await allocated(fbOf(id))).toBeLessThan(MiB);
  });
});
