/**
 * Moving sandbox desktops between two agents on this machine (two state dirs: two "hosts"), over
 * the real transfer server: files written on A read the same on B after the move (hard links,
 * holes, symlinks, deletions and replaced directories of a fork's overlay included), forks that
 * share a layer fetch it once, a broken connection resumes, a corrupted byte is caught, a running
 * desktop is not exported, and an abort removes the copy. Needs root.
 *
 * Both hosts are one machine, whose desktops' cgroups are named by desktop id alone: a source
 * copy is destroyed before its moved copy starts, or the destroy would stop the moved one.
 */
import { lstat, mkdtemp, readdir, readFile, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { CommandHandlers } from '../../agent/src/handlers.js';
import { newId } from '../../shared/src/ids.js';
import type { ExportResult, ImportResult } from '../../shared/src/transfer.js';
import { failure } from '../helpers/agent-failure.js';
import { startMoveHost, type MoveHost as Host } from '../helpers/move-hosts.js';
import { isRoot } from '../helpers/sandbox.js';
import { startTransferProxy, type TransferProxy } from '../helpers/transfer-proxy.js';
import { until } from '../helpers/wait.js';
import { discardsSettled } from '../../agent/src/runtime/sandbox/host/discarded.js';
import { coldExecIsQuick } from '../../agent/src/runtime/sandbox/guest/guest-entry.js';

/** What a guest's /root holds: every entry with its type, link target, link count and hash. */
const MANIFEST = `cd /root && find . -printf '%y %p %l %n\\n' | sort && find . -type f -exec sha256sum {} + | sort -k2`;

describe.skipIf(!isRoot)('moving sandbox desktops between two agents', () => {
  let base: string;
  let a: Host;
  let b: Host;
  const proxies: TransferProxy[] = [];
  let op = 0;
  const generation = new Map<string, number>();
  const next = (id: string) => {
    const g = (generation.get(id) ?? 0) + 1;
    generation.set(id, g);
    return g;
  };

  const host = (name: string) => startMoveHost(join(base, name), { retries: 3, backoffMs: 20 });

  const cmd = (h: Host, type: Parameters<CommandHandlers['handle']>[0], id: string, extra: object = {}) =>
    h.handlers.handle(type, { desktop_id: id, generation: next(id), operation_id: `op_${++op}`, ...extra });
  const start = (h: Host, id: string) => cmd(h, 'desktop.start', id, { tier: 'small', first_boot: null });
  const hibernate = (h: Host, id: string) => cmd(h, 'desktop.hibernate', id);
  const destroy = (h: Host, id: string) => cmd(h, 'desktop.destroy', id);
  const exportFrom = (h: Host, id: string) => h.handlers.handle('desktop.export', { desktop_id: id, generation: next(id), ttl_ms: 600_000 }) as Promise<ExportResult>;
  const importInto = (h: Host, id: string, exp: { url: string; ticket: string }) =>
    h.handlers.handle('desktop.import', { desktop_id: id, generation: generation.get(id)!, tier: 'small', source: { url: exp.url, ticket: exp.ticket } }) as Promise<ImportResult>;
  async function sh(h: Host, id: string, command: string): Promise<string> {
    const out = await h.driver.exec(id, { command, timeoutMs: 30_000, maxOutputBytes: 1 << 20 });
    expect(out.exitCode, `${command}: ${out.stderr}`).toBe(0);
    return out.stdout;
  }
  const layers = async (h: Host) => (await readdir(join(h.state, 'runtime', 'layers')).catch(() => [] as string[])).sort();

  beforeAll(async () => {
    base = await mkdtemp(join(tmpdir(), 'canto-move-'));
    a = await host('a');
    b = await host('b');
  });

  afterAll(async () => {
    for (const p of proxies) await p.close();
    for (const h of [b, a]) {
      if (h === undefined) continue;
      for (const d of await h.driver.list()) await h.driver.destroy(d.desktopId);
      await h.close();
    }
    if (base) await rm(base, { recursive: true, force: true });
  });

  // A desktop, and two forks of it whose overlays stand on its frozen disk.
  const [d, f1, f2] = [newId('desktop'), newId('desktop'), newId('desktop')];
  let manifest = '';
  let f1Export: ExportResult;

  it('moves a fork with its overlay (whiteout, opaque dir, hard link, hole, symlink) and it starts with the same files', async () => {
    await cmd(a, 'desktop.prepare', d, { tier: 'small' });
    await start(a, d);
    await sh(a, d, 'head -c 1048576 /dev/urandom > /root/keep && echo bye > /root/gone && mkdir -p /root/dir && echo x > /root/dir/x && echo y > /root/dir/y');
    await hibernate(a, d);
    await a.handlers.handle('desktop.fork', {
      desktop_id: d, generation: generation.get(d), operation_id: `op_${++op}`,
      forks: [{ desktop_id: f1, generation: next(f1) }, { desktop_id: f2, generation: next(f2) }],
    });
    expect(await layers(a)).toHaveLength(1);

    await start(a, f1);
    await sh(a, f1, [
      'rm /root/gone',
      'rm -rf /root/dir && mkdir /root/dir && echo z > /root/dir/z',
      'echo linked > /root/a && ln /root/a /root/hard && ln -s a /root/sym',
      'truncate -s 50M /root/sparse && printf x | dd of=/root/sparse bs=1 seek=20000000 conv=notrunc status=none',
      'head -c 5242880 /dev/urandom > /root/rand',
    ].join(' && '));
    manifest = await sh(a, f1, MANIFEST);
    await hibernate(a, f1);
    // The overlay's upper layer records the deletion and the replaced directory.
    const upper = join(a.state, 'runtime', 'desktops', f1, 'upper', 'root');
    expect((await lstat(join(upper, 'gone'))).isCharacterDevice()).toBe(true);

    f1Export = await exportFrom(a, f1);
    expect(f1Export.units.map((u) => u.id)).toEqual(['desktop', `layer-${(await layers(a))[0]}`]);
    // Cut the desktop unit once, 2 MB in: the import resumes and completes.
    const cut = await startTransferProxy(f1Export.url, { cutAfter: 2_000_000, match: '/units/desktop' });
    proxies.push(cut);
    const result = await importInto(b, f1, { url: cut.url, ticket: f1Export.ticket });
    expect(cut.spoiled()).toBe(1);
    expect(result).toEqual({ fetched_bytes: f1Export.total_bytes, resumed_bytes: 0, units: 2 });
    // The layer, not yet on B, came alongside the desktop unit, not after it.
    const fetches = cut.exchanges().filter((e) => e.request.includes('/units/'));
    const layerFetch = fetches.find((e) => e.request.includes('/units/layer-'))!;
    const lastDesktopFetch = fetches.filter((e) => e.request.includes('/units/desktop')).at(-1)!;
    expect(layerFetch.opened).toBeLessThan(lastDesktopFetch.closed!);
    expect(await readdir(join(b.state, 'runtime', 'incoming'))).toEqual([]);

    // Faithful: the copy on B gives the very same unit streams (and is stopped, so exportable).
    const again = await exportFrom(b, f1);
    expect(again.units).toEqual(f1Export.units);

    // The source copy goes before the moved one starts (see the module comment).
    await destroy(a, f1);
    await discardsSettled(join(a.state, 'runtime'));
    expect(await layers(a)).toHaveLength(1); // d and f2 still stand on it
    await start(b, f1);
    // Its first start since the move: its warm servers come up before any call is made (the exec
    // server only where a cold exec is slower than a warm one: guest-entry.ts).
    await until(async () => {
      const pids = (await readFile(`/sys/fs/cgroup/pids/canto/${f1}/cgroup.procs`, 'utf8').catch(() => '')).split('\n').filter(Boolean);
      const comms = await Promise.all(pids.map((pid) => readFile(`/proc/${pid}/comm`, 'utf8').catch(() => '')));
      return (coldExecIsQuick() || comms.some((c) => c.trim() === 'canto-exec')) && comms.some((c) => c.startsWith('canto-helper'));
    }, 10_000, 'the moved desktop\'s warm servers');
    expect(await sh(b, f1, MANIFEST)).toBe(manifest);
    expect(await sh(b, f1, 'ls /root/dir; test ! -e /root/gone && echo gone')).toBe('z\ngone\n');
    expect(Number(await sh(b, f1, 'stat -c %b /root/sparse'))).toBeLessThan(1000); // still sparse
  }, 240_000);

  it('moves a second fork without fetching the shared layer again, resumes a later command, and catches a corrupted byte', async () => {
    const exp = await exportFrom(a, f2);
    const desktopUnit = exp.units.find((u) => u.id === 'desktop')!;
    const layerUnit = exp.units.find((u) => u.id !== 'desktop')!;
    expect(layerUnit).toEqual(f1Export.units[1]); // the same layer, the same stream

    // Cut more often than the importer retries: the command fails, keeping the bytes it got,
    // and the next command replays them into a new unpacking and fetches only the rest.
    const cuts = await startTransferProxy(exp.url, { cutAfter: 5_000, times: 4, match: '/units/desktop' });
    proxies.push(cuts);
    expect(await failure(importInto(b, f2, { url: cuts.url, ticket: exp.ticket }))).toMatchObject({ retryable: true });
    const partial = (await stat(join(b.state, 'runtime', 'incoming', f2, 'desktop.part'))).size;
    expect(partial).toBeGreaterThan(0);
    const resumed = await importInto(b, f2, exp);
    expect(resumed).toEqual({ fetched_bytes: desktopUnit.bytes - partial, resumed_bytes: partial + layerUnit.bytes, units: 2 });
    expect(await b.handlers.handle('desktop.import.abort', { desktop_id: f2, generation: generation.get(f2) })).toEqual({});

    const flip = await startTransferProxy(exp.url, { flipBodyByte: 5_000, match: '/units/desktop' });
    proxies.push(flip);
    const bad = await failure(importInto(b, f2, { url: flip.url, ticket: exp.ticket }));
    expect(bad.retryable).toBe(true);
    expect(bad.message).toMatch(/sha256|unpack/);
    const result = await importInto(b, f2, { url: flip.url, ticket: exp.ticket });
    expect(result).toEqual({ fetched_bytes: desktopUnit.bytes, resumed_bytes: layerUnit.bytes, units: 2 });
    expect(await layers(b)).toEqual(await layers(a));
  }, 120_000);

  it('refuses to export a running desktop', async () => {
    await start(a, d);
    expect((await failure(exportFrom(a, d))).code).toBe('conflict');
    await hibernate(a, d);
  }, 60_000);

  it('aborts an import: the copy that never started goes, the layer stays while a started desktop stands on it', async () => {
    expect(await b.handlers.handle('desktop.import.abort', { desktop_id: f2, generation: generation.get(f2) })).toEqual({});
    expect((await b.driver.list()).map((x) => x.desktopId)).toEqual([f1]);
    expect(await layers(b)).toHaveLength(1);
    // f1 has run on B since its import: an abort keeps it.
    await hibernate(b, f1);
    expect((await failure(b.handlers.handle('desktop.import.abort', { desktop_id: f1, generation: generation.get(f1) }))).code).toBe('conflict');
    await destroy(b, f1);
    // Collected behind the destroy's answer.
    await until(async () => (await layers(b)).length === 0, 10_000, "the layer to be collected once f1's overlay is released");
  }, 60_000);
});
