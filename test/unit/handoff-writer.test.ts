/**
 * The batching writer of handed-off uploads (guest-handoff.ts) on a real file: chunks queued
 * faster than writes complete land in order, and a failed write fails the flush and later writes.
 */
import { randomBytes } from 'node:crypto';
import { mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { BatchedWriter, HandedFd, parseHandedFile } from '../../agent/src/runtime/sandbox/guest/guest-handoff.js';

describe('handoff writer', () => {
  const dir = mkdtempSync(join(tmpdir(), 'canto-handoff-writer-'));
  afterEach(() => rmSync(join(dir, 'f'), { force: true }));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('writes queued chunks in order, whatever their sizes', async () => {
    const path = join(dir, 'f');
    const fd = new HandedFd(openSync(path, 'w'));
    const writer = new BatchedWriter(fd);
    const parts = Array.from({ length: 300 }, (_, i) => randomBytes(1 + ((i * 7919) % 70_000)));
    for (const part of parts) {
      writer.write(part);
      if (parts.indexOf(part) % 50 === 0) await new Promise((r) => setImmediate(r));
    }
    writer.write(Buffer.alloc(0));
    await writer.flush();
    fd.close();
    expect(readFileSync(path).equals(Buffer.concat(parts))).toBe(true);
  });

  it('fails the flush and every later write after a failed write', async () => {
    const path = join(dir, 'f');
    writeFileSync(path, '');
    const fd = new HandedFd(openSync(path, 'r'));
    const writer = new BatchedWriter(fd);
    writer.write(Buffer.from('no'));
    await expect(writer.flush()).rejects.toMatchObject({ code: 'EBADF' });
    expect(() => writer.write(Buffer.from('more'))).toThrow();
    fd.close();
    fd.close();
    await expect(fd.read(Buffer.alloc(1), 0)).rejects.toThrow(/closed/);
  });

  it('parses the helper handoff fields strictly', () => {
    expect(parseHandedFile(['12', '5', '2049', '1234567890123'])).toEqual({ guestPid: 12, fd: 5, dev: 2049n, ino: 1234567890123n });
    for (const bad of [[], ['1', '2', '3'], ['0', '5', '1', '1'], ['x', '5', '1', '1'], ['1', '-5', '1', '1'], ['1', '99999999', '1', '1']]) {
      expect(() => parseHandedFile(bad), bad.join(' ')).toThrow(/malformed/);
    }
  });
});
