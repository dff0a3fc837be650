/**
 * A unit's stream raw (agent/src/transfer/raw-unit.ts, RAW_UNIT_PROTOCOL): what the source
 * answers, how the importer reads it into buffers it reuses, and how it falls back to the plain
 * chunked stream of a source that predates it. Real transfer servers on the fake runtime.
 */
import { createHash, randomBytes } from 'node:crypto';
import { createServer, type Server } from 'node:net';
import { Readable, Writable } from 'node:stream';
import { afterEach, describe, expect, it } from 'vitest';
import { RangeRefused, TransientFetchError } from '../../agent/src/transfer/client.js';
import { pump } from '../../agent/src/transfer/pump.js';
import { openRawUnit, type RawUnitBody } from '../../agent/src/transfer/raw-unit.js';
import { RAW_UNIT_PROTOCOL } from '../../shared/src/transfer.js';
import { BIG, closeFakeMoveHosts, D, exportFrom, fakeMoveHost, importInto, stoppedDesktop } from '../helpers/fake-move-hosts.js';
import { startTransferProxy, type TransferProxy } from '../helpers/transfer-proxy.js';

const proxies: TransferProxy[] = [];

afterEach(async () => {
  for (const p of proxies.splice(0)) await p.close();
  await closeFakeMoveHosts();
});

async function exported() {
  const a = await fakeMoveHost();
  await stoppedDesktop(a);
  return { a, exp: await exportFrom(a, 4, D, 'sized') };
}

const unitUrl = (base: string, offset = 0) => new URL(`${base}/v1/transfer/${D}/units/desktop?offset=${offset}`);
const options = (ticket: string) => ({ ticket, idleTimeoutMs: 5_000 });

/** Reads a raw body whole; `hold` ms before each chunk is taken (0: at once). */
async function readAll(body: RawUnitBody, hold = 0): Promise<{ bytes: Buffer; digest: string; buffers: Set<ArrayBufferLike>; chunks: number }> {
  const parts: Buffer[] = [];
  const buffers = new Set<ArrayBufferLike>();
  const digest = await body.read((chunk, release) => {
    buffers.add(chunk.buffer);
    if (hold === 0) {
      parts.push(Buffer.from(chunk));
      release();
      return null;
    }
    // Read only when handed back, as the spool file and the unpacking do: a buffer the reader
    // filled again before that would show here.
    const at = parts.push(chunk) - 1;
    return new Promise((resolve) => setTimeout(() => {
      parts[at] = Buffer.from(chunk);
      release();
      resolve();
    }, hold));
  });
  return { bytes: Buffer.concat(parts), digest, buffers, chunks: parts.length };
}

describe('a unit stream, raw', () => {
  it('comes after a 101, whole, with its digest; the importer moves the desktop that way', async () => {
    const { a, exp } = await exported();
    const plain = Buffer.from(await (await fetch(unitUrl(a.server.url), { headers: { authorization: `Bearer ${exp.ticket}` } })).arrayBuffer());
    const body = await openRawUnit(unitUrl(a.server.url), 0, options(exp.ticket));
    expect(body).not.toBeNull();
    expect(body!.unitBytes).toBe(exp.total_bytes);
    const got = await readAll(body!);
    expect(got.bytes.equals(plain)).toBe(true);
    expect(got.digest).toBe(createHash('sha256').update(plain).digest('hex'));

    // From an offset: the rest, and the digest of the whole.
    const rest = await readAll((await openRawUnit(unitUrl(a.server.url, 1_000_000), 1_000_000, options(exp.ticket)))!);
    expect(rest.bytes.equals(plain.subarray(1_000_000))).toBe(true);
    expect(rest.digest).toBe(got.digest);

    const b = await fakeMoveHost();
    const watch = await startTransferProxy(a.server.url, { times: 0 });
    proxies.push(watch);
    expect((await importInto(b, { url: watch.url, ticket: exp.ticket })).fetched_bytes).toBe(exp.total_bytes);
    expect(watch.exchanges().filter((e) => e.request.includes('/units/desktop')).map((e) => e.response)).toEqual(['HTTP/1.1 101 Switching Protocols']);
    expect(b.driver.desktops.get(D)?.files.get('/root/big')?.equals(BIG)).toBe(true);
  });

  it('reuses a buffer once its taker hands it back, and never before', async () => {
    const { a, exp } = await exported();
    const slabs = Math.ceil(exp.total_bytes / (1 << 20));
    expect(slabs).toBeGreaterThanOrEqual(4);
    const plain = Buffer.from(await (await fetch(unitUrl(a.server.url), { headers: { authorization: `Bearer ${exp.ticket}` } })).arrayBuffer());
    // Handed back at once: one buffer of full size serves every chunk but the smaller last one.
    const quick = await readAll((await openRawUnit(unitUrl(a.server.url), 0, options(exp.ticket)))!);
    expect(quick.chunks).toBe(slabs);
    expect(quick.buffers.size).toBe(2);
    expect(quick.bytes.equals(plain)).toBe(true);
    // Taken slowly: the reader waits for each chunk to be taken, and the bytes stay right.
    const slow = await readAll((await openRawUnit(unitUrl(a.server.url), 0, options(exp.ticket)))!, 20);
    expect(slow.bytes.equals(plain)).toBe(true);
    // Never handed back: every chunk has a buffer of its own.
    const kept = new Set<ArrayBufferLike>();
    await (await openRawUnit(unitUrl(a.server.url), 0, options(exp.ticket)))!.read((chunk) => {
      kept.add(chunk.buffer);
      return null;
    });
    expect(kept.size).toBe(slabs);
  });

  it('is refused as the plain stream is, with the same errors', async () => {
    const { a, exp } = await exported();
    const refused = (url: URL, offset: number, ticket: string) => openRawUnit(url, offset, options(ticket)).then(() => null, (err: unknown) => err);
    // A ticket the source does not hold is cured by a new export; one it finds malformed is not.
    expect(await refused(unitUrl(a.server.url), 0, `ttk_${'A'.repeat(43)}`)).toMatchObject({ code: 'unauthorized', retryable: true });
    expect(await refused(unitUrl(a.server.url), 0, 'nope')).toMatchObject({ code: 'unauthorized', retryable: false });
    expect(await refused(unitUrl(a.server.url, exp.total_bytes + 1), exp.total_bytes + 1, exp.ticket)).toBeInstanceOf(RangeRefused);
    expect(await refused(new URL(`${a.server.url}/v1/transfer/dsk_bbbbbbbbbbbbbbbbbbbbbbbb/units/desktop`), 0, exp.ticket)).toMatchObject({ code: 'not_found' });
    // Only a unit or a pre-copy comes raw, not the listing: the source says 400, which has the
    // reader ask again without the upgrade.
    expect(await openRawUnit(new URL(`${a.server.url}/v1/transfer/${D}/units`), 0, options(exp.ticket))).toBeNull();
    // A ticket that would break the request's head is never sent.
    expect(await refused(unitUrl(a.server.url), 0, 'a\r\nx-evil: 1')).toMatchObject({ code: 'bad_request' });
  });

  it('asks again without the upgrade when something on the way refuses upgrades', async () => {
    const refusing = createServer((socket) => {
      socket.on('error', () => undefined);
      socket.once('data', () => socket.end('HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n'));
    });
    await new Promise<void>((resolve) => refusing.listen(0, '127.0.0.1', resolve));
    try {
      const url = new URL(`http://127.0.0.1:${(refusing.address() as { port: number }).port}/v1/transfer/${D}/units/desktop?offset=0`);
      expect(await openRawUnit(url, 0, options('t'))).toBeNull();
    } finally {
      await new Promise((resolve) => refusing.close(resolve));
    }
  });

  it('falls back to the plain stream when the source predates it, and resumes there too', async () => {
    const { a, exp } = await exported();
    const old = await startTransferProxy(a.server.url, { plainOnly: true, cutAfter: 700_000, times: 2, match: '/units/desktop' });
    proxies.push(old);
    const b = await fakeMoveHost();
    expect((await importInto(b, { url: old.url, ticket: exp.ticket })).fetched_bytes).toBe(exp.total_bytes);
    expect(old.spoiled()).toBe(2);
    const answers = old.exchanges().filter((e) => e.request.includes('/units/desktop')).map((e) => e.response);
    expect(answers.length).toBeGreaterThanOrEqual(3);
    expect(answers.every((r) => r === 'HTTP/1.1 200 OK')).toBe(true);
    expect(b.driver.desktops.get(D)?.files.get('/root/big')?.equals(BIG)).toBe(true);
  });
});

describe('the source of a raw stream', () => {
  const stream = (bytes: number) => ({ body: Readable.from([Buffer.alloc(bytes, 7)]), done: Promise.resolve() });
  const sink = () => new Writable({ write: (_chunk, _enc, cb) => cb() });

  it('fails a stream longer or shorter than the length it announced, and passes one of that length', async () => {
    await expect(pump(stream(10), sink(), 0, 8)).rejects.toThrow(/longer than its 8 bytes/);
    await expect(pump(stream(10), sink(), 0, 12)).rejects.toThrow(/ended at 10 of 12 bytes/);
    expect(await pump(stream(10), sink(), 0, 10)).toBe(createHash('sha256').update(Buffer.alloc(10, 7)).digest('hex'));
  });
});

describe('a stream of unknown length, raw (a pre-copy)', () => {
  /** A source answering the upgrade with `body` in pieces, its digest unless told not to, then an end or a reset. */
  async function source(body: Buffer, how: { end: 'end' | 'reset'; digest?: boolean }): Promise<URL> {
    const server = createServer((socket) => {
      socket.on('error', () => undefined);
      socket.once('data', () => {
        socket.write(`HTTP/1.1 101 Switching Protocols\r\nconnection: Upgrade\r\nupgrade: ${RAW_UNIT_PROTOCOL}\r\n\r\n`);
        // Pieces of an odd size: the digest held back spans reads.
        for (let i = 0; i < body.length; i += 100_003) socket.write(body.subarray(i, i + 100_003));
        if (how.digest !== false) socket.write(createHash('sha256').update(body).digest('hex'));
        if (how.end === 'end') socket.end();
        else setTimeout(() => socket.resetAndDestroy(), 50);
      });
    });
    servers.push(server);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    return new URL(`http://127.0.0.1:${(server.address() as { port: number }).port}/v1/transfer/${D}/precopy/pc_aaaaaaaaaaaaaaaa`);
  }
  const servers: Server[] = [];
  afterEach(async () => {
    for (const server of servers.splice(0)) await new Promise((resolve) => server.close(resolve));
  });

  it('runs to the end, its last 64 characters the digest, however short', async () => {
    for (const size of [3 * (1 << 20) + 17, 10, 0]) {
      const body = randomBytes(size);
      const raw = (await openRawUnit(await source(body, { end: 'end' }), null, options('t')))!;
      expect(raw.unitBytes).toBeNull();
      const got = await readAll(raw);
      expect(got.bytes.equals(body)).toBe(true);
      expect(got.digest).toBe(createHash('sha256').update(body).digest('hex'));
    }
  });

  it('fails on a reset, and on an end that leaves less than a digest', async () => {
    const reset = (await openRawUnit(await source(randomBytes(1 << 20), { end: 'reset' }), null, options('t')))!;
    await expect(readAll(reset)).rejects.toBeInstanceOf(TransientFetchError);
    const short = (await openRawUnit(await source(randomBytes(10), { end: 'end', digest: false }), null, options('t')))!;
    await expect(readAll(short)).rejects.toThrow(/closed before the unit ended/);
  });
});
