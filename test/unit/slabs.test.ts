/**
 * Bulk bytes in reused buffers (agent/src/runtime/slabs.ts) on the sending side of a move: a
 * child's stdout read through the spawner's helper into slabs, handed back only once written,
 * and `tar`'s unit streams pumped that way give the bytes and the hash the plain reading gives.
 * Real processes and sockets.
 */
import { createHash } from 'node:crypto';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SLAB_BYTES, SlabReader, type SlabTaker } from '../../agent/src/runtime/slabs.js';
import { helperPath, spawnProcess } from '../../agent/src/runtime/sandbox/host/spawner.js';
import { tarStream } from '../../agent/src/runtime/sandbox/host/unit-tar.js';
import { pump } from '../../agent/src/transfer/pump.js';

let dir: string;
const DATA_BYTES = 5 * SLAB_BYTES + 12_345;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'canto-slabs-'));
  const data = Buffer.alloc(DATA_BYTES);
  for (let i = 0; i + 4 <= data.length; i += 4) data.writeUInt32LE(i, i);
  await mkdir(join(dir, 'src'));
  await writeFile(join(dir, 'src', 'data'), data);
  await writeFile(join(dir, 'src', 'small'), 'small');
});

afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** `cat` of the data file, its stdout read into slabs by `take`. */
async function catInSlabs(take: SlabTaker): Promise<{ code: number | null }> {
  const reader = new SlabReader();
  const child = await spawnProcess('cat', [join(dir, 'src', 'data')], { stdio: ['ignore', 'pipe', 'ignore'], stdoutOnread: reader.onread });
  expect(child.stdoutOnread).toBe(true);
  const closed = new Promise<number | null>((resolve) => child.once('close', (code: number | null) => resolve(code)));
  await reader.read(child.stdout!, take);
  return { code: await closed };
}

describe.skipIf(helperPath() === null)('a child stdout in slabs', () => {
  it('comes whole, in full slabs but the last, through one buffer when each is handed back at once', async () => {
    const parts: Buffer[] = [];
    const buffers = new Set<ArrayBufferLike>();
    const { code } = await catInSlabs((chunk, release) => {
      buffers.add(chunk.buffer);
      parts.push(Buffer.from(chunk));
      release();
      return null;
    });
    expect(code).toBe(0);
    const whole = Buffer.concat(parts);
    expect(whole.length).toBe(DATA_BYTES);
    const last = DATA_BYTES - 4 - (DATA_BYTES % 4);
    expect(whole.readUInt32LE(last)).toBe(last);
    expect(parts.slice(0, -1).every((p) => p.length === SLAB_BYTES)).toBe(true);
    expect(buffers.size).toBe(2);
  });

  it('never fills a slab again before it is handed back, however slowly the taker writes', async () => {
    const parts: Buffer[] = [];
    await catInSlabs((chunk, release) => {
      // Read only when handed back, as a socket's write is: a slab filled again before would show.
      const at = parts.push(chunk) - 1;
      return new Promise((resolve) => setTimeout(() => {
        parts[at] = Buffer.from(chunk);
        release();
        resolve();
      }, 15));
    });
    const whole = Buffer.concat(parts);
    for (let i = 0; i + 4 <= whole.length; i += 4 * 4096) expect(whole.readUInt32LE(i)).toBe(i);
    expect(whole.length).toBe(DATA_BYTES);
  });

  it('fails when the taker does, and the child is not left writing', async () => {
    const reader = new SlabReader();
    const child = await spawnProcess('cat', [join(dir, 'src', 'data')], { stdio: ['ignore', 'pipe', 'ignore'], stdoutOnread: reader.onread });
    const closed = new Promise<[number | null, string | null]>((resolve) => child.once('close', (code: number | null, signal: string | null) => resolve([code, signal])));
    await expect(reader.read(child.stdout!, () => {
      throw new Error('the receiver went away');
    })).rejects.toThrow(/the receiver went away/);
    // Its stdout is gone: the child stops on its next write rather than finishing the file.
    const [code, signal] = await closed;
    expect(code === 0 && signal === null).toBe(false);
  });
});

describe.skipIf(helperPath() === null)('a unit stream pumped in slabs', () => {
  /**
   * A receiver that writes each chunk 5 ms later, as a busy socket would, and takes several
   * slabs before it is full: the reading goes on meanwhile, so a slab handed back before it was
   * written would be filled again under it.
   */
  function slowReceiver(): { out: Writable; bytes(): Buffer } {
    const got: Buffer[] = [];
    const out = new Writable({
      highWaterMark: 4 * SLAB_BYTES,
      write(chunk: Buffer, _enc, cb) {
        setTimeout(() => {
          got.push(Buffer.from(chunk));
          cb();
        }, 5);
      },
    });
    return { out, bytes: () => Buffer.concat(got) };
  }

  it('sends from an offset the bytes and the whole hash the plain reading gives', async () => {
    const plain = await tarStream(join(dir, 'src'), ['.']);
    expect(plain.slabs).toBeUndefined();
    const chunks: Buffer[] = [];
    for await (const chunk of plain.body) chunks.push(chunk as Buffer);
    await plain.done;
    const whole = Buffer.concat(chunks);

    for (const offset of [0, SLAB_BYTES + 7]) {
      const stream = await tarStream(join(dir, 'src'), ['.'], [], { slabs: true });
      expect(stream.slabs).toBeDefined();
      const receiver = slowReceiver();
      const digest = await pump(stream, receiver.out, offset, whole.length);
      await new Promise((resolve) => receiver.out.end(resolve));
      expect(digest).toBe(createHash('sha256').update(whole).digest('hex'));
      expect(receiver.bytes().equals(whole.subarray(offset))).toBe(true);
    }
  });
});
