/**
 * What a sandbox desktop's `desktop` unit holds (sandbox-transfer.ts) and the tar streams units
 * travel as (unit-tar.ts): the same tree gives the same bytes every time, and the tree unpacked
 * on the other side gives those bytes again, with links, holes, symlinks, whiteouts and
 * `trusted.*` xattrs intact. The parts that make device nodes and trusted xattrs need root.
 */
import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { link, lstat, mkdir, mkdtemp, open, readlink, rm, stat, symlink, truncate, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { desktopUnitMembers } from '../../agent/src/runtime/sandbox/host/sandbox-transfer.js';
import { tarSize, tarStream, untar } from '../../agent/src/runtime/sandbox/host/unit-tar.js';
import { digestOf } from '../../agent/src/transfer/digests.js';

const isRoot = process.getuid?.() === 0;
let dir: string;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'canto-units-'));
});

afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** Node has no xattr calls; python3 (always on the hosts) does. */
function setXattr(path: string, name: string, value: string): void {
  execFileSync('python3', ['-c', 'import os,sys; os.setxattr(sys.argv[1], sys.argv[2], sys.argv[3].encode())', path, name, value]);
}

function getXattr(path: string, name: string): string {
  return execFileSync('python3', ['-c', 'import os,sys; print(os.getxattr(sys.argv[1], sys.argv[2]).decode(), end="")', path, name]).toString();
}

/** Unpacks a whole stream with the importer's sink, as an import does. */
async function extract(dir: string, body: Readable): Promise<void> {
  const sink = await untar(dir);
  // A tar that stops reading fails the pipe; its own exit says why.
  await pipeline(body, sink.input).catch(() => undefined);
  await sink.done;
}

async function tree(root: string, names: string[]): Promise<void> {
  await mkdir(root, { recursive: true });
  for (const name of names) {
    if (name.endsWith('/')) await mkdir(join(root, name), { recursive: true });
    else await writeFile(join(root, name), name);
  }
}

describe('the desktop unit of a sandbox desktop', () => {
  it('moves the writable layer, the snapshot, the display record and the markers, and nothing of this host', async () => {
    const plain = join(dir, 'plain');
    await tree(plain, [
      '.ready', 'disk/', 'display.json', 'display.json.123.ab12.tmp', 'fb/', 'first-boot-done', 'rootfs/', 'run/', 'snapshot/',
      'snapshot.tmp/', 'snapshot.failed-1700000000000/', 'imported.json',
    ]);
    expect(await desktopUnitMembers(plain)).toEqual(['.ready', 'disk', 'display.json', 'fb', 'first-boot-done', 'snapshot']);

    // An overlay: the writable layer is upper/ and the chain; the mounted disk/ and work/ stay.
    const overlay = join(dir, 'overlay');
    await tree(overlay, ['.ready', 'disk/', 'fb/', 'layers.json', 'layers.next.json.tmp', 'run/', 'rootfs/', 'snapshot/', 'upper/', 'work/']);
    expect(await desktopUnitMembers(overlay)).toEqual(['.ready', 'fb', 'layers.json', 'snapshot', 'upper']);

    // A cold-stopped desktop has no snapshot, and its framebuffer file is of no use to a cold boot.
    const cold = join(dir, 'cold');
    await tree(cold, ['.ready', 'disk/', 'fb/', 'first-boot-done', 'run/']);
    expect(await desktopUnitMembers(cold)).toEqual(['.ready', 'disk', 'first-boot-done']);
  });
});

describe('unit tar streams', () => {
  it('are the same bytes every time, and unpack into a tree that gives them again', async () => {
    const src = join(dir, 'src');
    await mkdir(join(src, 'd', 'sub'), { recursive: true });
    await writeFile(join(src, 'd', 'a'), 'a file');
    await link(join(src, 'd', 'a'), join(src, 'd', 'hard'));
    await symlink('a', join(src, 'd', 'sym'));
    // Sparse: 16 MiB long, one block written in the middle.
    await writeFile(join(src, 'd', 'sparse'), '');
    await truncate(join(src, 'd', 'sparse'), 16 << 20);
    const fh = await open(join(src, 'd', 'sparse'), 'r+');
    await fh.write(Buffer.from('middle'), 0, 6, 8 << 20);
    await fh.close();
    setXattr(join(src, 'd', 'a'), 'user.note', 'kept');
    if (isRoot) {
      // What overlayfs leaves in a writable layer: a whiteout and an opaque directory.
      execFileSync('mknod', [join(src, 'd', 'deleted'), 'c', '0', '0']);
      setXattr(join(src, 'd', 'sub'), 'trusted.overlay.opaque', 'y');
    }

    const first = await digestOf(await tarStream(src, ['.']));
    await new Promise((r) => setTimeout(r, 20)); // a later moment changes nothing
    const second = await digestOf(await tarStream(src, ['.']));
    expect(second).toEqual(first);
    expect(first.bytes).toBeLessThan(1 << 20); // the hole did not travel

    const dst = join(dir, 'dst');
    await mkdir(dst);
    await extract(dst, (await tarStream(src, ['.'])).body);
    expect(await digestOf(await tarStream(dst, ['.']))).toEqual(first);
    expect((await stat(join(dst, 'd', 'hard'))).ino).toBe((await stat(join(dst, 'd', 'a'))).ino);
    expect(await readlink(join(dst, 'd', 'sym'))).toBe('a');
    const sparse = await stat(join(dst, 'd', 'sparse'));
    expect(sparse.size).toBe(16 << 20);
    expect(sparse.blocks * 512).toBeLessThan(1 << 20);
    expect(getXattr(join(dst, 'd', 'a'), 'user.note')).toBe('kept');
    if (isRoot) {
      const wh = await lstat(join(dst, 'd', 'deleted'));
      expect(wh.isCharacterDevice() && wh.rdev === 0).toBe(true);
      expect(getXattr(join(dst, 'd', 'sub'), 'trusted.overlay.opaque')).toBe('y');
    }
  });

  it('are measured to the byte without being read (the sized listing)', async () => {
    const src = join(dir, 'src'); // the tree of the test above: links, holes, whiteouts, xattrs
    const tree = join(dir, 'sized');
    await mkdir(join(tree, 'many'), { recursive: true });
    for (let i = 0; i < 300; i++) await writeFile(join(tree, 'many', `f${i}`), Buffer.alloc(i * 37, i));
    await writeFile(join(tree, 'random'), randomBytes(3 << 20));
    // Data, a hole, data again, and a hole at the end: the sparse map shapes the headers.
    await writeFile(join(tree, 'holes'), randomBytes(70_000));
    const fh = await open(join(tree, 'holes'), 'r+');
    await fh.write(randomBytes(5000), 0, 5000, 9 << 20);
    await fh.close();
    await truncate(join(tree, 'holes'), 20 << 20);
    await writeFile(join(tree, 'x'.repeat(200)), 'a name longer than ustar holds');
    for (const [root, members] of [[src, ['.']], [tree, ['.']], [tree, ['random', 'many']]] as const) {
      expect(await tarSize(root, members)).toBe((await digestOf(await tarStream(root, members))).bytes);
    }
    await expect(tarSize(join(dir, 'missing'), ['.'])).rejects.toThrow(/tar --totals failed/);
  });

  it('fail loudly rather than end early when tar fails, and reject a corrupt stream', async () => {
    await expect(tarStream(join(dir, 'missing'), ['.']).then(digestOf)).rejects.toThrow(/tar --create failed/);
    const dst = join(dir, 'corrupt');
    await mkdir(dst);
    const bytes = Buffer.concat([Buffer.alloc(512, 7), Buffer.alloc(1024)]);
    await expect(extract(dst, Readable.from([bytes]))).rejects.toThrow(/tar --extract failed/);
  });

  it.skipIf(!isRoot)('fail rather than drop an extended attribute the target cannot hold (tar itself exits 0)', async () => {
    const src = join(dir, 'xattr-src');
    // A name with a quote: tar prints it as it is in its warning.
    await tree(src, ['upper/', "upper/it's gone/"]);
    // What overlayfs marks a directory opaque with: lost, the lower layer's files would come back.
    setXattr(join(src, 'upper', "it's gone"), 'trusted.overlay.opaque', 'y');
    // ramfs holds no extended attributes at all.
    const dst = join(dir, 'ramfs');
    await mkdir(dst);
    execFileSync('mount', ['-t', 'ramfs', 'none', dst]);
    try {
      const stream = await tarStream(src, ['.']);
      await expect(extract(dst, stream.body)).rejects.toThrow(/could not keep an extended attribute: Cannot set 'trusted.overlay.opaque'/);
    } finally {
      execFileSync('umount', [dst]);
    }
  });

  it('sha256 of the stream is what a plain hash of its bytes gives', async () => {
    const chunks: Buffer[] = [];
    const stream = await tarStream(join(dir, 'src'), ['.']);
    for await (const chunk of stream.body) chunks.push(chunk as Buffer);
    await stream.done;
    const whole = Buffer.concat(chunks);
    const digest = await digestOf({ body: Readable.from([whole]), done: Promise.resolve() });
    expect(digest).toEqual({ bytes: whole.length, sha256: createHash('sha256').update(whole).digest('hex') });
  });
});
