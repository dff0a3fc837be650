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
 *
 * Asked with a pre-copy id (`reuse`, 1.12) that it knows, a sized listing lists the `desktop`
 * unit without the pre-copied files still unchanged, names them, and versions the unit by the
 * id: a target that resumes a unit resumes the same bytes (precopy-source.ts).
 */
import type { Readable, Writable } from 'node:stream';
import { AgentFailure } from '../../../shared/src/protocol.js';
import type { ListingMode, TransferUnit } from '../../../shared/src/transfer.js';
import { DESKTOP_UNIT, type DesktopTransfer } from '../runtime/transfer.js';
import { UnitDigests } from './digests.js';
import { PrecopySource } from './precopy-source.js';
import { pump } from './pump.js';
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

/** A unit about to be sent. */
export interface OutgoingUnit {
  /** Size of the whole unit stream. */
  readonly bytes: number;
  /**
   * Writes the unit from the offset asked for into `out` (which it does not end), with
   * backpressure, and resolves with the whole stream's sha256 (hex) once the producer is done.
   * Rejects, and stops the producer, when either side fails or `out` closes first, and with
   * `exact`, when the stream's length is not `bytes` (nothing around the bytes would tell).
   */
  send(out: Writable, exact?: boolean): Promise<string>;
}

export class TransferSource {
  private readonly digests: UnitDigests;
  private readonly active = new Map<string, Set<Readable>>();
  readonly precopies: PrecopySource;

  constructor(private readonly deps: TransferSourceDeps) {
    this.digests = deps.digests ?? new UnitDigests();
    this.precopies = new PrecopySource(deps.transfer);
  }

  /** Picks the files of a (running) desktop to send ahead and grants a ticket for them. */
  async exportPrecopy(desktopId: string, generation: number, ttlMs: number): Promise<{ ticket: string; id: string; files: number; bytes: number }> {
    const picked = await this.precopies.begin(desktopId, generation);
    const { ticket } = this.deps.tickets.issue(desktopId, generation, ttlMs, 'sized');
    return { ...picked, ticket };
  }

  /** Streams pre-copy `id` into `out`; its streams are cut as the unit streams are. */
  sendPrecopy(desktopId: string, generation: number, id: string, out: Writable): Promise<string> {
    return this.precopies.send(desktopId, generation, id, out, (stop) => {
      const handle = { destroy: stop } as unknown as Readable;
      this.track(desktopId, handle);
      return () => this.untrack(desktopId, handle);
    });
  }

  /**
   * Lists a stopped desktop's units and grants a ticket for them. With `reuse` (a pre-copy the
   * target holds) the listing is the one the target will ask for, whose sizes are then kept.
   */
  async exportDesktop(
    desktopId: string, generation: number, ttlMs: number, mode: ListingMode = 'hashed', reuse: string | null = null,
  ): Promise<Listing & { ticket: string }> {
    const listing = await this.listing(desktopId, generation, mode, reuse);
    const { ticket } = this.deps.tickets.issue(desktopId, generation, ttlMs, this.sized(mode) ? 'sized' : 'hashed');
    return { ...listing, ticket };
  }

  /**
   * The desktop's units; `not_found` or `conflict` when it cannot be sent. Hashed: with sizes and
   * hashes, one full pass over each unit (kept until the desktop changes). Sized, when the driver
   * can count a unit without reading it: sizes and versions only, the hash coming as the trailer
   * of each fetch.
   */
  async listing(desktopId: string, generation: number, mode: ListingMode = 'hashed', reuse: string | null = null): Promise<Listing> {
    const units: TransferUnit[] = [];
    for (const id of await this.deps.transfer.units(desktopId)) {
      if (this.sized(mode)) {
        const left = await this.leftOut(desktopId, generation, id, reuse);
        const key = UnitDigests.key(desktopId, generation, id) + (left === null ? '' : `/${left.id}`);
        units.push({
          id, bytes: await this.sizeOf(desktopId, id, key, left?.paths), version: key, ...(left === null ? {} : { reuse: { precopy_id: left.id, paths: [...left.paths] } }),
        });
        continue;
      }
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
  async openUnit(
    desktopId: string, generation: number, unitId: string, offset: number, mode: ListingMode = 'hashed', reuse: string | null = null,
  ): Promise<OutgoingUnit> {
    const units = await this.deps.transfer.units(desktopId);
    if (!units.includes(unitId)) throw new AgentFailure('not_found', `${desktopId} has no unit ${unitId}`, false);
    const left = this.sized(mode) ? await this.leftOut(desktopId, generation, unitId, reuse) : null;
    const key = UnitDigests.key(desktopId, generation, unitId) + (left === null ? '' : `/${left.id}`);
    // A hashed listing's digest is at hand; under a sized one the size is enough here, and the
    // hash is what this fetch produces.
    const expected = this.sized(mode)
      ? { bytes: await this.sizeOf(desktopId, unitId, key, left?.paths), sha256: null }
      : await this.digests.get(key, () => this.deps.transfer.read(desktopId, unitId));
    if (offset > expected.bytes) throw new AgentFailure('too_large', `offset ${offset} is past the unit's ${expected.bytes} bytes`, false);
    const stream = await this.deps.transfer.read(desktopId, unitId, left?.paths, { slabs: true });
    this.track(desktopId, stream.body);
    return {
      bytes: expected.bytes,
      send: async (out, exact = false) => {
        try {
          const sha256 = await pump(stream, out, offset, exact ? expected.bytes : undefined);
          if (expected.sha256 !== null && sha256 !== expected.sha256) {
            // Not what the listing promised: the next export must look again.
            this.digests.drop(key);
            this.deps.log('a unit stream differs from its listed hash', { desktopId, unit: unitId });
          }
          return sha256;
        } finally {
          this.untrack(desktopId, stream.body);
        }
      },
    };
  }

  private sized(mode: ListingMode): boolean {
    return mode === 'sized' && this.deps.transfer.size !== undefined;
  }

  private sizeOf(desktopId: string, unitId: string, key: string, leaveOut?: readonly string[]): Promise<number> {
    return this.digests.size(key, () => this.deps.transfer.size!(desktopId, unitId, leaveOut));
  }

  /** What of the unit a pre-copy lets it leave out; null when nothing (the unit goes whole). */
  private async leftOut(desktopId: string, generation: number, unitId: string, reuse: string | null): Promise<{ id: string; paths: readonly string[] } | null> {
    if (reuse === null || unitId !== DESKTOP_UNIT) return null;
    const paths = await this.precopies.reusable(desktopId, generation, reuse);
    return paths === null ? null : { id: reuse, paths };
  }

  /**
   * A desktop just stopped for a move after a pre-copy went out: its listing, as the target
   * holding that pre-copy will ask for it, is counted now (one pass of `tar` over the unit), while
   * the scheduler goes on to the import; the target's request then finds the sizes kept. Nothing
   * happens without such a pre-copy, and a failure here only means the request counts itself.
   */
  prime(desktopId: string, generation: number): void {
    const id = this.precopies.sentId(desktopId, generation);
    if (id === null || !this.sized('sized')) return;
    this.listing(desktopId, generation, 'sized', id).catch(() => undefined);
  }

  /**
   * No move reads the desktop from here any more (it starts here again, or is destroyed): the
   * tickets its exports granted stop working at once. A fetch they admitted already is cut by
   * `invalidate`; the importer holding one is told 401 and its move asks for a new export.
   */
  revoke(desktopId: string): void {
    this.deps.tickets.revoke(desktopId);
  }

  /** The desktop may change: forget its digests and pre-copy and cut the streams being sent of it. */
  invalidate(desktopId: string): void {
    this.digests.forget(desktopId);
    this.precopies.forget(desktopId);
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
