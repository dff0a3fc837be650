/**
 * Moving a desktop between two agents on the fake runtime (agent/src/transfer/, fake-transfer.ts):
 * the commands through the real handlers, the bytes through a real transfer server and socket.
 * Covers the protocol around the bytes: tickets, refusals, progress, resume after a broken
 * connection, a corrupted byte, idempotent import and abort.
 */
import { mkdir, readdir, readFile, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { DesktopMoves } from '../../agent/src/transfer/moves.js';
import type { ExportResult, ImportProgressPayload } from '../../shared/src/transfer.js';
import { failure } from '../helpers/agent-failure.js';
import { BIG, closeFakeMoveHosts, D, exportFrom, fakeMoveHost as host, importInto, stoppedDesktop } from '../helpers/fake-move-hosts.js';
import { startTransferProxy, type TransferProxy } from '../helpers/transfer-proxy.js';

const proxies: TransferProxy[] = [];

afterEach(async () => {
  for (const p of proxies.splice(0)) await p.close();
  await closeFakeMoveHosts();
});

async function fetchUnits(url: string, ticket: string | null, id = D): Promise<Response> {
  return fetch(`${url}/v1/transfer/${id}/units`, { headers: ticket === null ? {} : { authorization: `Bearer ${ticket}` } });
}

describe('moving a fake desktop between two agents', () => {
  it('exports, imports with progress, starts on the target with the same files and its memory', async () => {
    const [a, b] = [await host(), await host()];
    await stoppedDesktop(a);
    const exp = await exportFrom(a);
    expect(exp.url).toBe(a.server.url);
    expect(exp.units).toHaveLength(1);
    expect(exp.units[0]).toMatchObject({ id: 'desktop', bytes: exp.total_bytes });
    const progress: ImportProgressPayload[] = [];
    const result = await importInto(b, exp, (type, payload) => {
      expect(type).toBe('desktop.import.progress');
      progress.push(payload as ImportProgressPayload);
    });
    expect(result).toEqual({ fetched_bytes: exp.total_bytes, resumed_bytes: 0, units: 1 });
    expect(progress.at(-1)).toEqual({ desktop_id: D, done_bytes: exp.total_bytes, total_bytes: exp.total_bytes });
    expect(b.driver.desktops.get(D)).toMatchObject({ tier: 'default', running: false, hasSnapshot: true, firstBootRuns: 1 });
    // Nothing is left in staging.
    expect(await readdir(join(b.dir, 'incoming'))).toEqual([]);

    // Repeating the import finds the work done.
    expect(await importInto(b, exp)).toEqual({ fetched_bytes: 0, resumed_bytes: exp.total_bytes, units: 1 });

    expect(await b.handlers.handle('desktop.start', { desktop_id: D, generation: 5, operation_id: 'op_3', tier: 'default', first_boot: null })).toEqual({ restored: true });
    expect(b.driver.desktops.get(D)?.files.get('/root/big')?.equals(BIG)).toBe(true);
    expect(b.driver.desktops.get(D)?.files.get('/root/note')?.toString()).toBe('hello');
    // Started: an abort keeps it now, and a new import conflicts.
    expect((await failure(b.handlers.handle('desktop.import.abort', { desktop_id: D, generation: 5 }))).code).toBe('conflict');
    expect((await failure(importInto(b, exp, undefined, 5))).code).toBe('conflict');

    // The source copy goes with destroy, and the export's ticket with it.
    await a.handlers.handle('desktop.destroy', { desktop_id: D, generation: 6, operation_id: 'op_4' });
    expect(a.driver.desktops.has(D)).toBe(false);
    expect((await fetchUnits(a.server.url, exp.ticket)).status).toBe(401);
  });

  it("fetches afresh over a copy another move left at the same generation, and finds a repeat of its own move's done", async () => {
    const [a, b] = [await host(), await host()];
    await stoppedDesktop(a);
    const first = await exportFrom(a);
    expect((await importInto(b, first, undefined, 4, 'op_move_1')).fetched_bytes).toBe(first.total_bytes);
    // That move failed after the install and could not abort it here; the desktop ran on at its
    // source at the same generation, and was written to.
    await a.handlers.handle('desktop.start', { desktop_id: D, generation: 4, operation_id: 'op_move_1', tier: 'small', first_boot: null });
    await a.driver.writeFile(D, { path: '/root/note', appendAt: null }, (async function* () { yield Buffer.from('written after'); })());
    await a.handlers.handle('desktop.hibernate', { desktop_id: D, generation: 4, operation_id: 'op_move_2' });
    const second = await exportFrom(a);

    const moved = await importInto(b, second, undefined, 4, 'op_move_2');
    expect(moved.fetched_bytes).toBe(second.total_bytes);
    expect(b.driver.desktops.get(D)?.files.get('/root/note')?.toString()).toBe('written after');
    // A repeat of the same move's import finds its work done.
    expect(await importInto(b, second, undefined, 4, 'op_move_2')).toEqual({ fetched_bytes: 0, resumed_bytes: second.total_bytes, units: 1 });
  });

  it('fetches afresh a unit another move staged here before it failed, though its version and size are the same', async () => {
    const [a, b] = [await host(), await host()];
    await stoppedDesktop(a);
    const first = await exportFrom(a, 4, D, 'sized');
    // That move's import staged the whole unit, then its agent went before installing it.
    vi.spyOn(b.driver.transfer, 'install').mockRejectedValueOnce(new Error('killed'));
    await failure(importInto(b, first, undefined, 5, 'op_move_1'));
    // Rolled back without reaching the target: the desktop ran on at its source at the same
    // generation, and a file changed without changing its size.
    await a.handlers.handle('desktop.start', { desktop_id: D, generation: 4, operation_id: 'op_move_1', tier: 'small', first_boot: null });
    await a.driver.writeFile(D, { path: '/root/note', appendAt: null }, (async function* () { yield Buffer.from('HELLO'); })());
    await a.handlers.handle('desktop.hibernate', { desktop_id: D, generation: 4, operation_id: 'op_move_2' });
    const second = await exportFrom(a, 4, D, 'sized');
    expect(second.total_bytes).toBe(first.total_bytes);
    const moved = await importInto(b, second, undefined, 5, 'op_move_2');
    expect(moved.fetched_bytes).toBe(second.total_bytes);
    expect(b.driver.desktops.get(D)?.files.get('/root/note')?.toString()).toBe('HELLO');
  });

  it('takes a unit marked done in this boot as it is, and fetches again one marked in an earlier boot (its files may not have reached the disk)', async () => {
    for (const earlierBoot of [false, true]) {
      const [a, b] = [await host(), await host()];
      await stoppedDesktop(a);
      const exp = await exportFrom(a, 4, D, 'sized');
      vi.spyOn(b.driver.transfer, 'install').mockRejectedValueOnce(new Error('the agent went'));
      await failure(importInto(b, exp, undefined, 5, 'op_move_1'));
      const mark = join(b.driver.transfer.stagingDir(D), 'desktop.done');
      expect((await readFile(mark, 'utf8')).trim()).toBe((await readFile('/proc/sys/kernel/random/boot_id', 'utf8')).trim());
      if (earlierBoot) await writeFile(mark, '00000000-0000-0000-0000-000000000000');
      const again = await importInto(b, exp, undefined, 5, 'op_move_1');
      expect(again.fetched_bytes, earlierBoot ? 'marked in an earlier boot' : 'marked in this boot').toBe(earlierBoot ? exp.total_bytes : 0);
      await closeFakeMoveHosts();
    }
  });

  it('refuses to export a running or absent desktop, and serves nothing while it runs', async () => {
    const a = await host();
    expect((await failure(exportFrom(a, 4, 'dsk_cccccccccccccccccccccccc'))).code).toBe('not_found');
    await stoppedDesktop(a);
    const exp = await exportFrom(a);
    await a.handlers.handle('desktop.start', { desktop_id: D, generation: 4, operation_id: 'op_5', tier: 'small', first_boot: null });
    expect((await failure(exportFrom(a, 4))).code).toBe('conflict');
    // The export's ticket ended with the start; one granted while it runs (as a pre-copy's is)
    // gets nothing of it but a conflict.
    expect((await fetchUnits(a.server.url, exp.ticket)).status).toBe(401);
    const res = await fetchUnits(a.server.url, a.tickets.issue(D, 4, 60_000).ticket);
    expect(res.status).toBe(409);
    expect(res.headers.get('content-type')).toBe('application/problem+json');
    expect(await res.json()).toMatchObject({ status: 409 });
  });

  it('checks tickets: none, malformed, unknown, another desktop, expired, an older generation', async () => {
    const a = await host();
    await stoppedDesktop(a);
    const other = 'dsk_bbbbbbbbbbbbbbbbbbbbbbbb';
    await stoppedDesktop(a, other);
    const exp = await exportFrom(a);
    expect((await fetchUnits(a.server.url, exp.ticket)).status).toBe(200);
    expect((await fetchUnits(a.server.url, null)).status).toBe(401);
    expect((await fetchUnits(a.server.url, 'nope')).status).toBe(401);
    expect((await fetchUnits(a.server.url, `ttk_${'A'.repeat(43)}`)).status).toBe(401);
    expect((await fetchUnits(a.server.url, exp.ticket, other)).status).toBe(404);
    const unit = await fetch(`${a.server.url}/v1/transfer/${D}/units/desktop?offset=${exp.total_bytes + 1}`, { headers: { authorization: `Bearer ${exp.ticket}` } });
    expect(unit.status).toBe(416);
    // A command of a newer generation reached the source: the export is void.
    await a.handlers.handle('desktop.hibernate', { desktop_id: D, generation: 9, operation_id: 'op_6' });
    expect((await fetchUnits(a.server.url, exp.ticket)).status).toBe(409);
    const again = await exportFrom(a, 9);
    a.clock.now += 61_000;
    const expired = await fetchUnits(a.server.url, again.ticket);
    expect(expired.status).toBe(401);
    expect(await expired.json()).toMatchObject({ detail: expect.stringMatching(/expired/) });

    // The importer turns those refusals into its own failures.
    const b = await host();
    expect((await failure(importInto(b, { url: a.server.url, ticket: again.ticket }, undefined, 9))).code).toBe('unauthorized');
  });

  it('resumes a unit after the connection breaks mid-stream, within the command and across commands', async () => {
    const [a, b] = [await host(), await host()];
    await stoppedDesktop(a);
    const exp = await exportFrom(a);
    // Cut twice in one command: the importer retries and resumes at the bytes it holds.
    const cut = await startTransferProxy(a.server.url, { cutAfter: 700_000, times: 2, match: '/units/desktop' });
    proxies.push(cut);
    const result = await importInto(b, { url: cut.url, ticket: exp.ticket });
    expect(cut.spoiled()).toBe(2);
    expect(result.fetched_bytes).toBe(exp.total_bytes);
    expect(b.driver.desktops.get(D)?.files.get('/root/big')?.equals(BIG)).toBe(true);

    // Cut more often than the importer retries: the command fails retryable, keeping what it got.
    const c = await host();
    const often = await startTransferProxy(a.server.url, { cutAfter: 1_000_000, times: 3, match: '/units/desktop' });
    proxies.push(often);
    const err = await failure(importInto(c, { url: often.url, ticket: exp.ticket }));
    expect(err).toMatchObject({ code: 'runtime_error', retryable: true });
    const part = join(c.dir, 'incoming', D, 'desktop.part');
    const held = (await stat(part)).size;
    expect(held).toBeGreaterThan(0);
    const resumed = await importInto(c, { url: often.url, ticket: exp.ticket });
    expect(resumed).toEqual({ fetched_bytes: exp.total_bytes - held, resumed_bytes: held, units: 1 });
    expect(c.driver.desktops.get(D)?.files.get('/root/big')?.equals(BIG)).toBe(true);
  });

  it('fails over a connection cut before its unpacking was ready, instead of waiting for it forever', async () => {
    const [a, b] = [await host(), await host()];
    await stoppedDesktop(a);
    const exp = await exportFrom(a);
    // The first request goes out before the unpacking is set up (a process to start): the cut
    // comes while it still is, before anything listens to the response.
    const transfer = b.driver.transfer;
    const unpack = transfer.unpack.bind(transfer);
    (transfer as { unpack: typeof transfer.unpack }).unpack = async (...args) => {
      await new Promise((resolve) => setTimeout(resolve, 300));
      return unpack(...args);
    };
    const cut = await startTransferProxy(a.server.url, { cutAfter: 5_000, times: 3, match: '/units/desktop' });
    proxies.push(cut);
    expect(await failure(importInto(b, { url: cut.url, ticket: exp.ticket }))).toMatchObject({ code: 'runtime_error', retryable: true });
    expect(cut.spoiled()).toBe(3);
  }, 15_000);

  it('drops a unit whose sha256 does not match and fails retryable; the next import fetches it again', async () => {
    const [a, b] = [await host(), await host()];
    await stoppedDesktop(a);
    const exp = await exportFrom(a);
    const flip = await startTransferProxy(a.server.url, { flipBodyByte: 200_000, match: '/units/desktop' });
    proxies.push(flip);
    const err = await failure(importInto(b, { url: flip.url, ticket: exp.ticket }));
    expect(err).toMatchObject({ code: 'runtime_error', retryable: true });
    expect(err.message).toMatch(/sha256/);
    expect(await readdir(join(b.dir, 'incoming', D))).not.toContain('desktop.part');
    expect(b.driver.desktops.has(D)).toBe(false);
    expect(await importInto(b, { url: flip.url, ticket: exp.ticket })).toMatchObject({ fetched_bytes: exp.total_bytes, resumed_bytes: 0 });
    expect(b.driver.desktops.get(D)?.files.get('/root/big')?.equals(BIG)).toBe(true);
  });

  it('aborts: removes an imported copy that never started, and cancels an import in progress', async () => {
    const [a, b] = [await host(), await host()];
    await stoppedDesktop(a);
    const exp = await exportFrom(a);
    await importInto(b, exp);
    expect(await b.handlers.handle('desktop.import.abort', { desktop_id: D, generation: 4 })).toEqual({});
    expect(b.driver.desktops.has(D)).toBe(false);
    // Nothing there: still fine.
    expect(await b.handlers.handle('desktop.import.abort', { desktop_id: D, generation: 4 })).toEqual({});
    // An import that cannot get through is cancelled by the abort rather than waited for.
    const stall = await startTransferProxy(a.server.url, { cutAfter: 1_000_000, times: 100, match: '/units/desktop' });
    proxies.push(stall);
    const slow = new DesktopMoves({ driver: b.driver, source: null, url: null, log: () => undefined, retries: 100, backoffMs: 50 });
    const pending = failure(slow.importDesktop({ desktopId: D, generation: 4, tier: 'small', source: { url: stall.url, ticket: exp.ticket } }));
    await new Promise((r) => setTimeout(r, 100));
    slow.cancelImport(D);
    expect((await pending).message).toMatch(/cancelled/);
    await slow.abortImport(D);
    expect(await readdir(join(b.dir, 'incoming'))).toEqual([]);
  });
});

describe('a sized listing (protocol 1.10)', () => {
  it('lists sizes and versions without hashes, the same sizes a hashed listing gives, and moves the desktop', async () => {
    const [a, b] = [await host(), await host()];
    await stoppedDesktop(a);
    const hashed = await exportFrom(a, 4, D, 'hashed');
    const sized = await exportFrom(a, 4, D, 'sized');
    expect(sized.units).toEqual([{ id: 'desktop', bytes: hashed.units[0]!.bytes, version: `${D}@4` }]);
    expect(sized.total_bytes).toBe(hashed.total_bytes);
    // The units route lists as the ticket's export did.
    expect(((await (await fetchUnits(a.server.url, sized.ticket)).json()) as ExportResult).units[0]).not.toHaveProperty('sha256');
    expect(((await (await fetchUnits(a.server.url, hashed.ticket)).json()) as ExportResult).units[0]).toHaveProperty('sha256');

    expect(await importInto(b, sized)).toEqual({ fetched_bytes: sized.total_bytes, resumed_bytes: 0, units: 1 });
    await b.handlers.handle('desktop.start', { desktop_id: D, generation: 5, operation_id: 'op_3', tier: 'default', first_boot: null });
    expect(b.driver.desktops.get(D)?.files.get('/root/big')?.equals(BIG)).toBe(true);
  });

  it('resumes after broken connections and checks the whole unit against the trailer', async () => {
    const [a, b] = [await host(), await host()];
    await stoppedDesktop(a);
    const exp = await exportFrom(a, 4, D, 'sized');
    const cut = await startTransferProxy(a.server.url, { cutAfter: 700_000, times: 2, match: '/units/desktop' });
    proxies.push(cut);
    expect((await importInto(b, { url: cut.url, ticket: exp.ticket })).fetched_bytes).toBe(exp.total_bytes);
    expect(cut.spoiled()).toBe(2);
    expect(b.driver.desktops.get(D)?.files.get('/root/big')?.equals(BIG)).toBe(true);

    // A flipped byte: no listed hash to compare with, but the trailer's differs.
    const c = await host();
    const flip = await startTransferProxy(a.server.url, { flipBodyByte: 200_000, match: '/units/desktop' });
    proxies.push(flip);
    const err = await failure(importInto(c, { url: flip.url, ticket: exp.ticket }));
    expect(err).toMatchObject({ code: 'runtime_error', retryable: true });
    expect(err.message).toMatch(/sha256/);
    expect(c.driver.desktops.has(D)).toBe(false);
    expect((await importInto(c, { url: flip.url, ticket: exp.ticket })).fetched_bytes).toBe(exp.total_bytes);
  });

  it('verifies a unit found whole in staging (not yet marked done) by the trailer of its empty rest', async () => {
    const [a, b] = [await host(), await host()];
    await stoppedDesktop(a);
    const exp = await exportFrom(a, 4, D, 'sized');
    const whole = Buffer.from(await (await fetch(`${a.server.url}/v1/transfer/${D}/units/desktop`, { headers: { authorization: `Bearer ${exp.ticket}` } })).arrayBuffer());
    expect(whole.length).toBe(exp.total_bytes);
    const staging = join(b.dir, 'incoming', D);
    const listing = JSON.stringify({ units: exp.units, total_bytes: exp.total_bytes });
    const stage = async (bytes: Buffer) => {
      await mkdir(staging, { recursive: true });
      await writeFile(join(staging, 'listing.json'), listing);
      await writeFile(join(staging, 'desktop.part'), bytes);
    };
    const spoiled = Buffer.from(whole);
    spoiled[1000] = spoiled[1000]! ^ 0xff;
    await stage(spoiled);
    expect((await failure(importInto(b, exp))).message).toMatch(/sha256/);
    await stage(whole);
    expect(await importInto(b, exp)).toEqual({ fetched_bytes: 0, resumed_bytes: exp.total_bytes, units: 1 });
    expect(b.driver.desktops.get(D)?.files.get('/root/big')?.equals(BIG)).toBe(true);
  });

  it('forgets what was staged of a unit whose version changed (a later export of a changed desktop)', async () => {
    const [a, b] = [await host(), await host()];
    await stoppedDesktop(a);
    const first = await exportFrom(a, 4, D, 'sized');
    const often = await startTransferProxy(a.server.url, { cutAfter: 1_000_000, times: 3, match: '/units/desktop' });
    proxies.push(often);
    await failure(importInto(b, { url: often.url, ticket: first.ticket }));
    expect((await stat(join(b.dir, 'incoming', D, 'desktop.part'))).size).toBeGreaterThan(0);
    // The desktop runs and changes on the source, then is exported again at a new generation.
    await a.handlers.handle('desktop.start', { desktop_id: D, generation: 5, operation_id: 'op_7', tier: 'small', first_boot: null });
    await a.driver.writeFile(D, { path: '/root/note', appendAt: null }, (async function* () { yield Buffer.from('HELLO'); })());
    await a.handlers.handle('desktop.hibernate', { desktop_id: D, generation: 6, operation_id: 'op_8' });
    const second = await exportFrom(a, 6, D, 'sized');
    expect(second.units[0]!.version).toBe(`${D}@6`);
    const result = await importInto(b, second, undefined, 7);
    expect(result).toEqual({ fetched_bytes: second.total_bytes, resumed_bytes: 0, units: 1 });
    expect(b.driver.desktops.get(D)?.files.get('/root/note')?.toString()).toBe('HELLO');
  });
});
