/**
 * Sizes and SHA-256 of unit streams, kept so that an export and the fetches after it do not each
 * produce the stream again only to count it. Knowing them takes one full pass over the unit.
 *
 * A desktop's own unit is keyed by desktop and generation, and forgotten whenever the desktop may
 * change (it starts, forks or is destroyed): its bytes are only stable while it stays stopped. A
 * layer's unit is keyed by the layer alone: layers never change, and forks exported one after
 * another share them. Concurrent requests for the same digest share one pass.
 */
import { createHash } from 'node:crypto';
import type { Readable } from 'node:stream';
import { DESKTOP_UNIT, type UnitStream } from '../runtime/transfer.js';

export interface UnitDigest {
  readonly bytes: number;
  readonly sha256: string;
}

/** Reads a unit stream to its end and returns its size and hash; fails if its producer did. */
export async function digestOf(stream: UnitStream): Promise<UnitDigest> {
  const hash = createHash('sha256');
  let bytes = 0;
  await new Promise<void>((resolve, reject) => {
    const body: Readable = stream.body;
    // 'data' events, not an async iterator: the iterator joins what is buffered, copying it.
    body.on('data', (chunk: Buffer) => {
      hash.update(chunk);
      bytes += chunk.length;
    });
    body.once('end', resolve);
    body.once('error', reject);
  });
  await stream.done;
  return { bytes, sha256: hash.digest('hex') };
}

export class UnitDigests {
  private readonly pending = new Map<string, Promise<UnitDigest>>();
  /** Sizes alone (a sized listing), by the same keys. */
  private readonly sizes = new Map<string, Promise<number>>();

  static key(desktopId: string, generation: number, unitId: string): string {
    return unitId === DESKTOP_UNIT ? `${desktopId}@${generation}` : unitId;
  }

  /** The unit's digest, from memory or by reading `open()` once. */
  get(key: string, open: () => Promise<UnitStream>): Promise<UnitDigest> {
    let entry = this.pending.get(key);
    if (entry === undefined) {
      entry = open().then(digestOf);
      this.pending.set(key, entry);
      // A failed pass is not remembered: the next request tries again.
      entry.catch(() => {
        if (this.pending.get(key) === entry) this.pending.delete(key);
      });
    }
    return entry;
  }

  /** The unit's size, from memory or by `count()` once. */
  size(key: string, count: () => Promise<number>): Promise<number> {
    let entry = this.sizes.get(key);
    if (entry === undefined) {
      entry = count();
      this.sizes.set(key, entry);
      entry.catch(() => {
        if (this.sizes.get(key) === entry) this.sizes.delete(key);
      });
    }
    return entry;
  }

  /** Forgets one digest (the stream turned out different from it). */
  drop(key: string): void {
    this.pending.delete(key);
    this.sizes.delete(key);
  }

  /** Forgets the desktop's own unit at every generation. */
  forget(desktopId: string): void {
    for (const map of [this.pending, this.sizes]) {
      for (const key of map.keys()) if (key.startsWith(`${desktopId}@`)) map.delete(key);
    }
  }
}
