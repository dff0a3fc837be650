/**
 * Pre-copy (shared/src/precopy.ts) on real files: two sandbox transfers (the driver's move side,
 * agent/src/runtime/sandbox/host/sandbox-transfer.ts) on state directories of their own, the
 * source's transfer server on loopback, real tar both ways. No guest runs: the "running" desktop
 * is a writable layer the test changes between the pre-copy and the copy after the stop, as a
 * guest would. Every case ends comparing the target's tree with the source's at the stop:
 * content, modes, owners, mtimes (directories too), xattrs, holes, hard links.
 */
import { execFileSync, spawn } from 'node:child_process';
import { once } from 'node:events';
import { createHash } from 'node:crypto';
import { appendFileSync, existsSync, chmodSync, chownSync, linkSync, mkdirSync, mkdtempSync, renameSync, rmSync, symlinkSync, truncateSync, unlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { GenerationStore } from '../../agent/src/generations.js';
import type { RuntimeDriver } from '../../agent/src/runtime/driver.js';
import { KeyedMutex } from '../../agent/src/runtime/sandbox/host/keyed-mutex.js';
import { scanCold, sharedWritableMaps } from '../../agent/src/runtime/sandbox/host/precopy-files.js';
import { SandboxTransfer } from '../../agent/src/runtime/sandbox/host/sandbox-transfer.js';
import { DesktopMoves } from '../../agent/src/transfer/moves.js';
import { TransferServer } from '../../agent/src/transfer/server.js';
import { TransferSource } from '../../agent/src/transfer/source.js';
import { TransferTickets } from '../../agent/src/transfer/tickets.js';
import type { TransferUnit } from '../../shared/src/transfer.js';
import { AgentFailure } from '../../shared/src/protocol.js';
import { startTransferProxy } from '../helpers/transfer-proxy.js';
import { until } from '../helpers/wait.js';

const isRoot = process.getuid?.() === 0;
/** Maps the file named shared and writable, says so, and holds the mapping until stdin closes. */
const MAPPER = `
import mmap, sys
f = open(sys.argv[1], 'r+b'); m = mmap.mmap(f.fileno(), 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
print('mapped', flush=True); sys.stdin.read()`;
const D = 'dsk_aaaaaaaaaaaaaaaaaaaaaaaa';
const KIB = 1024;

interface Host {
  dir: string;
  transfer: SandboxTransfer;
  moves: DesktopMoves;
  server: TransferServer;
  source: TransferSource;
}

const hosts: Host[] = [];

/** `flush`: what writes the host's filesystem to disk (the real one when absent). */
async function host(dir = mkdtempSync(join(tmpdir(), 'canto-precopy-')), flush?: (path: string) => Promise<void>): Promise<Host> {
  const transfer = new SandboxTransfer(dir, new KeyedMutex(), flush);
  const generations = await GenerationStore.open(dir);
  const tickets = new TransferTickets();
  const log = process.env.DEBUG_PRECOPY ? (msg: string, f?: object) => console.log(msg, f) : () => undefined;
  const source = new TransferSource({ transfer, tickets, log });
  const server = await TransferServer.start({ listenHost: '127.0.0.1', port: 0, advertiseHost: '127.0.0.1', source, tickets, generations, log });
  const moves = new DesktopMoves({ driver: { transfer } as unknown as RuntimeDriver, source, url: server.url, log, retries: 1, backoffMs: 5 });
  const h = { dir, transfer, moves, server, source };
  hosts.push(h);
  return h;
}

afterEach(async () => {
  for (const h of hosts.splice(0)) {
    await h.server.close();
    rmSync(h.dir, { recursive: true, force: true });
  }
});

const desktopDirIn = (dir: string) => join(dir, 'desktops', D);
const desktopDir = (h: Host) => desktopDirIn(h.dir);
const disk = (h: Host, ...parts: string[]) => join(desktopDir(h), 'disk', ...parts);

/** A desktop directory as the sandbox keeps one, with a plain writable layer. */
function desktopOn(h: Host): void {
  mkdirSync(disk(h, 'root', 'docs'), { recursive: true });
  mkdirSync(disk(h, 'home'), { recursive: true });
  writeFileSync(join(desktopDir(h), '.ready'), '');
  for (let i = 0; i < 4; i++) writeFileSync(disk(h, 'root', 'docs', `f${i}.bin`), bytes(i, 300 * KIB));
  writeFileSync(disk(h, 'root', 'small.txt'), 'small files go with the stop');
}

function bytes(seed: number, n: number): Buffer {
  const out = Buffer.alloc(n);
  for (let i = 0; i < n; i += 32) createHash('sha256').update(`${seed}:${i}`).digest().copy(out, i);
  return out;
}

/** Waits until the source's scan picks exactly `n` files (they must be cold first), and pre-copies them. */
async function precopy(s: Host, t: Host, n: number): Promise<{ precopy_id: string; files: number; url: string; ticket: string }> {
  await until(async () => (await s.transfer.precopy.scan(D)).length === n, 10_000, `${n} cold files`);
  const exported = await s.moves.exportPrecopy(D, 3, 60_000);
  expect(exported.files).toBe(n);
  await t.moves.importPrecopy({ desktopId: D, generation: 4, precopyId: exported.precopy_id, source: { url: exported.url, ticket: exported.ticket } });
  return exported;
}

/** Each count of the host's `desktop` unit from now on, as the files it left out. */
function desktopCounts(h: Host): Array<readonly string[]> {
  const counted: Array<readonly string[]> = [];
  const size = h.transfer.size.bind(h.transfer);
  h.transfer.size = (desktopId, unitId, leaveOut) => {
    if (unitId === 'desktop') counted.push(leaveOut ?? []);
    return size(desktopId, unitId, leaveOut);
  };
  return counted;
}

/**
 * The copy after the stop: a sized export, then the import. Answers the bytes fetched, and the
 * `desktop` unit as the source lists it to a target holding pre-copy `precopyId`.
 */
async function copyAfterStop(s: Host, t: Host, precopyId: string): Promise<{ fetched: number; unit: TransferUnit }> {
  const exported = await s.moves.exportDesktop(D, 3, 60_000, 'sized');
  const res = await fetch(`${exported.url}/v1/transfer/${D}/units?reuse=${precopyId}`, { headers: { authorization: `Bearer ${exported.ticket}` } });
  const listed = (await res.json()) as { units: TransferUnit[] };
  const imported = await t.moves.importDesktop({ desktopId: D, generation: 4, tier: 'small', source: { url: exported.url, ticket: exported.ticket } });
  return { fetched: imported.fetched_bytes, unit: listed.units.find((u) => u.id === 'desktop')! };
}

/** Every entry under `root`: type, mode, owner, size, mtime (ns), xattrs, allocated blocks, content hash, link group. */
function tree(root: string): Record<string, unknown> {
  const script = `
import os, sys, json, hashlib
root = sys.argv[1]; out = {}; inodes = {}
for dirpath, dirs, files in os.walk(root):
    for name in sorted(dirs + files):
        p = os.path.join(dirpath, name); st = os.lstat(p); rel = os.path.relpath(p, root)
        e = {'mode': st.st_mode, 'uid': st.st_uid, 'gid': st.st_gid, 'mtime': st.st_mtime_ns,
             'xattrs': {k: os.getxattr(p, k, follow_symlinks=False).hex() for k in sorted(os.listxattr(p, follow_symlinks=False))}}
        if os.path.isfile(p) and not os.path.islink(p):
            e['sha'] = hashlib.sha256(open(p, 'rb').read()).hexdigest(); e['size'] = st.st_size
            e['blocks'] = st.st_blocks; e['links'] = st.st_nlink
            e['group'] = inodes.setdefault(st.st_ino, rel)
        out[rel] = e
print(json.dumps(out))`;
  return JSON.parse(execFileSync('python3', ['-c', script, root], { encoding: 'utf8' })) as Record<string, unknown>;
}

function expectSameTree(s: Host, t: Host): void {
  const installed = join(t.dir, 'desktops', D, 'disk');
  expect(tree(installed)).toEqual(tree(disk(s)));
}

describe.skipIf(!isRoot)('pre-copy of a desktop being moved, on real files', () => {
  it('leaves unchanged pre-copied files out of the copy after the stop, and the tree comes out the same', async () => {
    const [s, t] = [await host(), await host()];
    desktopOn(s);
    chmodSync(disk(s, 'root', 'docs', 'f1.bin'), 0o640);
    chownSync(disk(s, 'root', 'docs', 'f1.bin'), 1234, 5678);
    const pc = await precopy(s, t, 4);
    const { fetched, unit } = await copyAfterStop(s, t, pc.precopy_id);
    expect(unit.reuse?.paths.sort()).toEqual([0, 1, 2, 3].map((i) => `disk/root/docs/f${i}.bin`));
    // The four 300 KiB files did not travel again: only headers, the small file and directories did.
    expect(fetched).toBeLessThan(100 * KIB);
    expectSameTree(s, t);
  });

  it('comes raw from a source that speaks it, and over plain HTTP from one that predates it', async () => {
    for (const plainOnly of [false, true]) {
      const [s, t] = [await host(), await host()];
      desktopOn(s);
      await until(async () => (await s.transfer.precopy.scan(D)).length === 4, 10_000, '4 cold files');
      const exported = await s.moves.exportPrecopy(D, 3, 60_000);
      const proxy = await startTransferProxy(exported.url, { plainOnly, times: 0 });
      try {
        await t.moves.importPrecopy({ desktopId: D, generation: 4, precopyId: exported.precopy_id, source: { url: proxy.url, ticket: exported.ticket } });
        const answers = proxy.exchanges().filter((e) => e.request.includes('/precopy/')).map((e) => e.response);
        expect(answers).toEqual(plainOnly ? ['HTTP/1.1 200 OK', 'HTTP/1.1 200 OK'] : ['HTTP/1.1 101 Switching Protocols']);
      } finally {
        await proxy.close();
      }
      expect((await copyAfterStop(s, t, exported.precopy_id)).fetched).toBeLessThan(100 * KIB);
      expectSameTree(s, t);
    }
  });

  it('counts the desktop unit once when the export is told of the pre-copy the target holds', async () => {
    const [s, t] = [await host(), await host()];
    desktopOn(s);
    const pc = await precopy(s, t, 4);
    const counted = desktopCounts(s);
    const exported = await s.moves.exportDesktop(D, 3, 60_000, 'sized', pc.precopy_id);
    const imported = await t.moves.importDesktop({ desktopId: D, generation: 4, tier: 'small', source: { url: exported.url, ticket: exported.ticket } });
    // Counted without the four pre-copied files, once: the import's listing and fetch found the size kept.
    expect(counted).toHaveLength(1);
    expect([...counted[0]!].sort()).toEqual([0, 1, 2, 3].map((i) => `disk/root/docs/f${i}.bin`));
    expect(exported.total_bytes).toBeLessThan(100 * KIB);
    expect(imported.fetched_bytes).toBe(exported.total_bytes);
    expectSameTree(s, t);
  });

  it('counts the listing as the desktop stops for a move, so the import fetching with the pre-copy ticket finds it counted', async () => {
    const [s, t] = [await host(), await host()];
    desktopOn(s);
    const pc = await precopy(s, t, 4);
    const counted = desktopCounts(s);
    s.moves.stoppedForMove(D, 3);
    await until(() => counted.length === 1, 10_000, 'the listing counted');
    // No export: the target fetches with the pre-copy's ticket, as the scheduler's leader does.
    const imported = await t.moves.importDesktop({ desktopId: D, generation: 4, tier: 'small', source: { url: pc.url, ticket: pc.ticket } });
    expect(counted).toHaveLength(1);
    expect([...counted[0]!].sort()).toEqual([0, 1, 2, 3].map((i) => `disk/root/docs/f${i}.bin`));
    expect(imported.fetched_bytes).toBeLessThan(100 * KIB);
    expectSameTree(s, t);
  });

  it('sends again a file written after the pre-copy, drops one deleted, and moves one renamed to its new name', async () => {
    const [s, t] = [await host(), await host()];
    desktopOn(s);
    const pc = await precopy(s, t, 4);
    writeFileSync(disk(s, 'root', 'docs', 'f0.bin'), bytes(100, 300 * KIB)); // rewritten, same size
    unlinkSync(disk(s, 'root', 'docs', 'f1.bin'));
    renameSync(disk(s, 'root', 'docs', 'f2.bin'), disk(s, 'home', 'renamed.bin'));
    const { fetched, unit } = await copyAfterStop(s, t, pc.precopy_id);
    expect(unit.reuse?.paths).toEqual(['disk/root/docs/f3.bin']);
    expect(fetched).toBeGreaterThan(600 * KIB); // f0 and the renamed f2 went again
    expectSameTree(s, t);
    expect(tree(join(t.dir, 'desktops', D, 'disk'))['root/docs/f1.bin']).toBeUndefined();
  });

  it('does not reuse a file appended to while the pre-copy read it', async () => {
    const [s, t] = [await host(), await host()];
    desktopOn(s);
    await until(async () => (await s.transfer.precopy.scan(D)).length === 4, 10_000, 'cold files');
    const files = s.transfer.precopy;
    const read = files.read.bind(files);
    // The guest appends while tar streams the files: after tar has begun, before the source looks again.
    (files as { read: typeof files.read }).read = async (desktopId, paths) => {
      const stream = await read(desktopId, paths);
      stream.body.once('data', () => appendFileSync(disk(s, 'root', 'docs', 'f3.bin'), 'appended during the read'));
      return stream;
    };
    const pc = await precopy(s, t, 4);
    const { unit } = await copyAfterStop(s, t, pc.precopy_id);
    expect(unit.reuse?.paths.sort()).toEqual([0, 1, 2].map((i) => `disk/root/docs/f${i}.bin`));
    expectSameTree(s, t);
  });

  it('keeps hard links, holes and xattrs exactly as a whole copy does', async () => {
    const [s, t] = [await host(), await host()];
    desktopOn(s);
    // Two names for one file: never pre-copied, and still one inode on the target.
    writeFileSync(disk(s, 'root', 'linked.bin'), bytes(7, 200 * KIB));
    linkSync(disk(s, 'root', 'linked.bin'), disk(s, 'home', 'other-name.bin'));
    // Sparse: 16 MiB with data at both ends.
    const sparse = disk(s, 'root', 'sparse.img');
    writeFileSync(sparse, bytes(8, 128 * KIB));
    truncateSync(sparse, 16 << 20);
    appendFileSync(sparse, bytes(9, 64 * KIB));
    const xattrs = `import os; p = ${JSON.stringify(disk(s, 'root', 'docs', 'f2.bin'))}; os.setxattr(p, 'user.tag', b'blue'); os.setxattr(p, 'trusted.overlay.origin', b'\\x00\\x01')`;
    execFileSync('python3', ['-c', xattrs]);
    const pc = await precopy(s, t, 5); // f0–f3 and the sparse file
    const { unit } = await copyAfterStop(s, t, pc.precopy_id);
    expect(unit.reuse?.paths).toContain('disk/root/sparse.img');
    expect(unit.reuse?.paths).not.toContain('disk/root/linked.bin');
    expectSameTree(s, t);
    const after = tree(join(t.dir, 'desktops', D, 'disk')) as Record<string, { blocks: number; group: string; links: number }>;
    expect(after['root/sparse.img']!.blocks * 512).toBeLessThan(1 << 20);
    expect(after['home/other-name.bin']!.group).toBe(after['root/linked.bin']!.group);
    expect(after['root/linked.bin']!.links).toBe(2);
  });

  it('pre-copies from the writable layer of an overlay, keeping whiteouts and opaque directories', async () => {
    const [s, t] = [await host(), await host()];
    const layer = 'lyr_aaaaaaaaaaaaaaaaaaaaaaaa';
    mkdirSync(join(s.dir, 'layers', layer, 'root', 'gone'), { recursive: true });
    writeFileSync(join(s.dir, 'layers', layer, 'root', 'deleted.bin'), bytes(1, 100 * KIB));
    mkdirSync(join(desktopDir(s), 'upper', 'root', 'gone'), { recursive: true });
    writeFileSync(join(desktopDir(s), '.ready'), '');
    writeFileSync(join(desktopDir(s), 'layers.json'), JSON.stringify({ lower: [layer] }));
    writeFileSync(join(desktopDir(s), 'upper', 'root', 'new.bin'), bytes(2, 300 * KIB));
    writeFileSync(join(desktopDir(s), 'upper', 'root', 'gone', 'inside.bin'), bytes(3, 300 * KIB));
    // overlayfs marks: a deleted lower file, and a directory that hides the lower one's contents.
    execFileSync('mknod', [join(desktopDir(s), 'upper', 'root', 'deleted.bin'), 'c', '0', '0']);
    execFileSync('python3', ['-c', `import os; os.setxattr(${JSON.stringify(join(desktopDir(s), 'upper', 'root', 'gone'))}, 'trusted.overlay.opaque', b'y')`]);
    const pc = await precopy(s, t, 2);
    const { unit } = await copyAfterStop(s, t, pc.precopy_id);
    expect(unit.reuse?.paths.sort()).toEqual(['upper/root/gone/inside.bin', 'upper/root/new.bin']);
    expect(tree(join(t.dir, 'desktops', D, 'upper'))).toEqual(tree(join(desktopDir(s), 'upper')));
    expect(tree(join(t.dir, 'layers', layer))).toEqual(tree(join(s.dir, 'layers', layer)));
  });

  it('copies whole when the source restarted: its list of pre-copied files is gone', async () => {
    const [s, t] = [await host(), await host()];
    desktopOn(s);
    const pc = await precopy(s, t, 4);
    // A new source process on the same disk knows no pre-copy: the unit is listed whole.
    await s.server.close();
    hosts.splice(hosts.indexOf(s), 1);
    const s2 = await host(s.dir);
    const whole = await copyAfterStop(s2, t, pc.precopy_id);
    expect(whole.unit.reuse).toBeUndefined();
    expect(whole.fetched).toBeGreaterThan(1200 * KIB);
    expectSameTree(s2, t);
  });

  it('fetches whole after a pre-copied file went missing on the target', async () => {
    const [s, t] = [await host(), await host()];
    desktopOn(s);
    await precopy(s, t, 4);
    rmSync(join(t.dir, 'incoming', D, 'pre', 'disk', 'root', 'docs', 'f2.bin'));
    const exported = await s.moves.exportDesktop(D, 3, 60_000, 'sized');
    const spec = { desktopId: D, generation: 4, tier: 'small' as const, source: { url: exported.url, ticket: exported.ticket } };
    await expect(t.moves.importDesktop(spec)).rejects.toMatchObject({ code: 'runtime_error', retryable: true });
    const again = await t.moves.importDesktop(spec);
    expect(again.fetched_bytes).toBeGreaterThan(1200 * KIB);
    expectSameTree(s, t);
  });

  it('leaves out a file a process maps shared and writable', async () => {
    const s = await host();
    desktopOn(s);
    const mapper = spawn('python3', ['-c', MAPPER, disk(s, 'root', 'docs', 'f0.bin')], { stdio: ['pipe', 'pipe', 'inherit'] });
    try {
      await until(() => mapper.stdout.read() !== null, 10_000, 'the mapping');
      const mapped = await sharedWritableMaps([mapper.pid!]);
      const later = { coldMs: 0, minBytes: 64 * KIB, now: Date.now() + 1000 };
      const picked = (await scanCold(desktopDir(s), ['disk'], { ...later, mapped })).map((e) => e.path);
      expect(picked).toEqual([1, 2, 3].map((i) => `disk/root/docs/f${i}.bin`));
      // Without the mapping it would have been picked.
      const unmapped = await scanCold(desktopDir(s), ['disk'], { ...later, mapped: { inodes: new Set(), paths: new Set() } });
      expect(unmapped).toHaveLength(4);
    } finally {
      mapper.stdin.end();
      await once(mapper, 'exit');
    }
  });

  it('reads nothing of the host through a directory the guest swapped for a symlink after the scan', async () => {
    const s = await host();
    desktopOn(s);
    // What a guest that won the race leaves: the scanned directory a link to a host directory.
    const outside = mkdtempSync(join(tmpdir(), 'canto-host-side-'));
    try {
      writeFileSync(join(outside, 'f0.bin'), 'HOST-SECRET '.repeat(30_000));
      renameSync(disk(s, 'root', 'docs'), disk(s, 'root', 'docs-real'));
      symlinkSync(outside, disk(s, 'root', 'docs'));
      const stream = await s.transfer.precopy.read(D, ['disk/root/docs/f0.bin', 'disk/root/docs-real/f1.bin']);
      const chunks: Buffer[] = [];
      for await (const chunk of stream.body) chunks.push(chunk as Buffer);
      await stream.done;
      const tar = Buffer.concat(chunks);
      expect(tar.includes('HOST-SECRET')).toBe(false);
      expect(tar.includes(bytes(1, 300 * KIB).subarray(0, 4096))).toBe(true); // the desktop's own file
    } finally {
      rmSync(outside, { recursive: true, force: true });
    }
  });

  it('drops the pre-copy with the staging when the move is rolled back', async () => {
    const [s, t] = [await host(), await host()];
    desktopOn(s);
    await precopy(s, t, 4);
    expect(existsSync(join(t.dir, 'incoming', D, 'pre', 'disk', 'root', 'docs', 'f0.bin'))).toBe(true);
    await t.moves.abortImport(D);
    expect(existsSync(join(t.dir, 'incoming', D))).toBe(false);
  });

  it('writes the pre-copy to disk before marking it, and the installed copy before and after its renames', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'canto-precopy-'));
    const staging = join(dir, 'incoming', D);
    // What each flush finds in place: what a power loss just after it would keep.
    const seen: string[] = [];
    const flush = async (path: string) => {
      if (!path.startsWith(dir)) seen.push(`elsewhere: ${path}`);
      else if (existsSync(desktopDirIn(dir))) seen.push(existsSync(staging) ? 'installed, staging kept' : 'installed');
      else if (existsSync(join(staging, 'x', 'desktop', '.ready'))) seen.push('staged');
      else if (existsSync(join(staging, 'pre')) && !existsSync(join(staging, 'precopy.json'))) seen.push('pre-copied, unmarked');
      else seen.push(`nothing in place (${path})`);
    };
    const [s, t] = [await host(), await host(dir, flush)];
    desktopOn(s);
    const pc = await precopy(s, t, 4);
    expect(seen).toEqual(['pre-copied, unmarked']);
    await copyAfterStop(s, t, pc.precopy_id);
    expect(seen).toEqual(['pre-copied, unmarked', 'staged', 'installed, staging kept']);
    expectSameTree(s, t);
    // A command sent again finds the copy installed (the last one may have failed writing it out).
    await t.moves.importDesktop({ desktopId: D, generation: 4, tier: 'small', source: { url: 'http://127.0.0.1:9', ticket: 'unused' } });
    expect(seen.at(-1)).toBe('installed');
  });

  it('installs nothing while the disk refuses the staged copy, and installs it whole on the next try', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'canto-precopy-'));
    let failing = true;
    const flush = async () => {
      if (failing && existsSync(join(dir, 'incoming', D, 'x', 'desktop'))) throw new AgentFailure('runtime_error', 'writing to disk failed: EIO', true);
    };
    const [s, t] = [await host(), await host(dir, flush)];
    desktopOn(s);
    const exported = await s.moves.exportDesktop(D, 3, 60_000, 'sized');
    const spec = { desktopId: D, generation: 4, tier: 'small' as const, source: { url: exported.url, ticket: exported.ticket } };
    await expect(t.moves.importDesktop(spec)).rejects.toMatchObject({ code: 'runtime_error', retryable: true });
    expect(existsSync(desktopDirIn(dir))).toBe(false);
    failing = false;
    await t.moves.importDesktop(spec);
    expectSameTree(s, t);
  });
});
