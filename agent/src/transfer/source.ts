/**
 * The sending side of a move, without the HTTP: what `desktop.export` answers and what the
 * transfer server (server.ts) streams to the agent that imports.
 *
 * An export lists the units of the stopped desktop with their sizes and hashes (kept by
 * digests.ts) and grants a ticket bound to the desktop and the generation it was exported
 * at. A fetch of a unit produces the unit's stream again from its first byte, skips to the offset
 * asked for, and hashes the whole stream on the way, so the trailer states the hash of what was
 * really produced, not of what was expected: a receiver that resumed after a break checks its
 * bytes against both. Should the two ever differ, the kept digest is dropped, and the next export
 * lists the unit as it is now.
 *
 * A desktop that starts (or forks, or is destroyed) here is `invalidate`d: its kept digests go and
 * the streams being sent of it are cut. Requests made after that see it running and are refused.
 */
import { createHash } from 'node:crypto';
import { Transform, type Readable, type TransformCallback } from 'node:stream';
import { AgentFailure } from '../../../shared/src/protocol.js';
import type { TransferUnit } from '../../../shared/src/transfer.js';
import type { DesktopTransfer } from '../runtime/transfer.js';
import { UnitDigests } from './digests.js';
import type { TransferTickets } from './tickets.js';

export interface TransferSourceDeps {
  readonly transfer: DesktopTransfer;
  readonly tickets: TransferTickets;
  readonly digests?: UnitDigests;
  readonly log: (msg: string, fields?: object) => void;
}

export interface Listing {
  readonly units: TransferUnit[];
  readonly total_bytes: number;
}

/** A unit being sent: its bytes from the offset asked for, and the hash of the whole stream. */
export interface OutgoingUnit {
  readonly body: Readable;
  /** Size of the whole unit stream. */
  readonly bytes: number;
  /** Settles with the whole stream's sha256 (hex) once `body` has ended. */
  readonly sha256: Promise<string>;
}

export class TransferSource {
  private readonly digests: UnitDigests;
  private readonly active = new Map<string, Set<Readable>>();

  constructor(private readonly deps: TransferSourceDeps) {
    this.digests = deps.digests ?? new UnitDigests();
  }

  /** Lists a stopped desktop's units and grants a ticket for them. */
  async exportDesktop(desktopId: string, generation: number, ttlMs: number): Promise<Listing & { ticket: string }> {
    const listing = await this.listing(desktopId, generation);
    const { ticket } = this.deps.tickets.issue(desktopId, generation, ttlMs);
    return { ...listing, ticket };
  }

  /** The desktop's units with sizes and hashes; `not_found` or `conflict` when it cannot be sent. */
  async listing(desktopId: string, generation: number): Promise<Listing> {
    const units: TransferUnit[] = [];
    for (const id of await this.deps.transfer.units(desktopId)) {
      const key = UnitDigests.key(desktopId, generation, id);
      const digest = await this.digests.get(key, () => this.deps.transfer.read(desktopId, id));
      units.push({ id, bytes: digest.bytes, sha256: digest.sha256 });
    }
    return { units, total_bytes: units.reduce((sum, u) => sum + u.bytes, 0) };
  }

  /**
   * Starts sending a unit from `offset`. `not_found` for a unit the desktop does not have,
   * `conflict` while it runs, `too_large` for an offset past the unit's end.
   */
  async openUnit(desktopId: string, generation: number, unitId: string, offset: number): Promise<OutgoingUnit> {
    const units = await this.deps.transfer.units(desktopId);
    if (!units.includes(unitId)) throw new AgentFailure('not_found', `${desktopId} has no unit ${unitId}`, false);
    const key = UnitDigests.key(desktopId, generation, unitId);
    const expected = await this.digests.get(key, () => this.deps.transfer.read(desktopId, unitId));
    if (offset > expected.bytes) throw new AgentFailure('too_large', `offset ${offset} is past the unit's ${expected.bytes} bytes`, false);
    const source = await this.deps.transfer.read(desktopId, unitId);
    let resolve!: (hex: string) => void;
    let reject!: (err: Error) => void;
    const sha256 = new Promise<string>((res, rej) => {
      resolve = res;
      reject = rej;
    });
    sha256.catch(() => undefined);
    const hash = createHash('sha256');
    let skip = offset;
    const body = new Transform({
      highWaterMark: 1 << 20,
      transform(chunk: Buffer, _encoding, callback: TransformCallback) {
        hash.update(chunk);
        if (skip >= chunk.length) {
          skip -= chunk.length;
          callback();
        } else {
          const out = skip > 0 ? chunk.subarray(skip) : chunk;
          skip = 0;
          callback(null, out);
        }
      },
      flush: (callback: TransformCallback) => {
        const hex = hash.digest('hex');
        if (hex !== expected.sha256) {
          // Not what the listing promised: the next export must look again.
          this.digests.drop(key);
          this.deps.log('a unit stream differs from its listed hash', { desktopId, unit: unitId });
        }
        resolve(hex);
        callback();
      },
    });
    source.once('error', (err) => body.destroy(err));
    body.once('close', () => {
      source.destroy();
      reject(new Error('the unit stream ended early'));
      this.untrack(desktopId, body);
    });
    source.pipe(body);
    this.track(desktopId, body);
    return { body, bytes: expected.bytes, sha256 };
  }

  /** The desktop may change: forget its digests and cut the streams being sent of it. */
  invalidate(desktopId: string): void {
    this.digests.forget(desktopId);
    for (const body of this.active.get(desktopId) ?? []) body.destroy(new Error(`${desktopId} changed on the source`));
  }

  /** Cuts every stream (the server is closing). */
  close(): void {
    for (const set of this.active.values()) for (const body of set) body.destroy(new Error('the transfer server is closing'));
  }

  private track(desktopId: string, body: Readable): void {
    let set = this.active.get(desktopId);
    if (set === undefined) this.active.set(desktopId, (set = new Set()));
    set.add(body);
  }

  private untrack(desktopId: string, body: Readable): void {
    const set = this.active.get(desktopId);
    if (set?.delete(body) && set.size === 0) this.active.delete(desktopId);
  }
}
