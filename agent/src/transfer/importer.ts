/**
 * `desktop.import` on the target host: fetch a stopped desktop's units from the source's transfer
 * server into staging, verify them, and install them (shared/src/transfer.ts).
 *
 * The desktop's own unit is unpacked before any layer is skipped: once it is, its layer chain is
 * known, and from then on the layers it names count as in use here (layers.ts does not collect
 * them), so a layer this host already holds (a fork moved before) can be skipped safely. Layers
 * this host does not hold are fetched alongside it, since they come whatever the chain says (and
 * a layer under a desktop that was running is often the whole of a move's wait after the stop:
 * a golden template's layer, say). Each unit resumes where an earlier
 * command left it (unit-fetch.ts). The listing of the previous attempt is kept in staging; a unit
 * whose hash changed since (the desktop was exported again after it ran) starts over.
 *
 * A pre-copy held whole in staging for this generation (precopy-import.ts) is named in the
 * listing's request (`?reuse=`); the `desktop` unit then comes without the files the source says
 * are unchanged since, and its unpacking links the pre-copied ones into place first. Should any
 * of them be missing here, the pre-copy is dropped and the command fails retryable: the next
 * try fetches the unit whole.
 *
 * Idempotent: a desktop installed by an import of the same generation answers at once. A copy
 * installed by an earlier import that never started here is replaced; any other copy (one that
 * ran here) is a `conflict`, as is a desktop running here.
 */
import { mkdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { Type, type Static } from '@sinclair/typebox';
import { AgentFailure, parseMessage } from '../../../shared/src/protocol.js';
import type { Tier } from '../../../shared/src/tiers.js';
import { TransferUnit, type ImportProgressPayload, type ImportResult } from '../../../shared/src/transfer.js';
import { DESKTOP_UNIT, layerUnit, type DesktopTransfer } from '../runtime/transfer.js';
import { classify, getJson, TransientFetchError } from './client.js';
import { dropPrecopy, heldPrecopy } from './precopy-import.js';
import { fetchUnit, unitFiles } from './unit-fetch.js';

const Listing = Type.Object({ units: Type.Array(TransferUnit, { minItems: 1 }), total_bytes: Type.Integer({ minimum: 0 }) });
type Listing = Static<typeof Listing>;

/** At most this often a progress notification, in ms. */
const PROGRESS_MS = 250;

export interface ImportSpec {
  readonly desktopId: string;
  readonly generation: number;
  /** The move it belongs to (1.15); absent from an older scheduler. */
  readonly operationId?: string;
  readonly tier: Tier;
  readonly source: { readonly url: string; readonly ticket: string };
}

export interface ImportOptions {
  readonly transfer: DesktopTransfer;
  readonly signal: AbortSignal;
  /** Sends `desktop.import.progress`; absent when nobody listens. */
  readonly progress?: (payload: ImportProgressPayload) => void;
  readonly log: (msg: string, fields?: object) => void;
  /** Passed to fetchUnit (tests shorten them). */
  readonly retries?: number;
  readonly backoffMs?: number;
}

export async function importDesktop(options: ImportOptions, spec: ImportSpec): Promise<ImportResult> {
  const { transfer } = options;
  const here = await transfer.inspect(spec.desktopId);
  if (here.running) throw new AgentFailure('conflict', `${spec.desktopId} is running on this host`, false);
  if (here.held) {
    if (here.imported?.generation === spec.generation && here.imported.operationId === spec.operationId) {
      // An earlier command of this move installed it and may have failed writing it to disk.
      await transfer.flush(spec.desktopId);
      return { fetched_bytes: 0, resumed_bytes: here.imported.totalBytes, units: here.imported.units };
    }
    // An earlier import's copy that never ran here is an outdated copy of the same desktop (at the
    // same generation too, when the move that made it failed after the install and the desktop
    // ran on at its source: it holds what the desktop was then).
    if (here.imported === null) throw new AgentFailure('conflict', `another copy of ${spec.desktopId} is on this host`, false);
    await transfer.discard(spec.desktopId);
  }

  const base = spec.source.url.replace(/\/+$/, '');
  const precopyId = await heldPrecopy(transfer, spec.desktopId, spec.generation);
  const query = precopyId === null ? '' : `?reuse=${precopyId}`;
  const listing = await fetchListing(options, `${base}/v1/transfer/${encodeURIComponent(spec.desktopId)}/units${query}`, spec.source.ticket);
  const staging = transfer.stagingDir(spec.desktopId);
  await mkdir(staging, { recursive: true });
  await forgetChangedUnits(staging, listing, spec.operationId ?? null);

  const progress = throttle(options.progress, spec.desktopId, listing.total_bytes);
  const units = new Map(listing.units.map((u) => [u.id, u]));
  const desktop = units.get(DESKTOP_UNIT);
  if (desktop === undefined) throw new AgentFailure('runtime_error', 'the source listed no desktop unit', false);
  if (desktop.reuse !== undefined && (desktop.reuse.precopy_id !== precopyId || !(await transfer.precopy!.holds(spec.desktopId, desktop.reuse.paths)))) {
    await dropPrecopy(transfer, spec.desktopId);
    throw new AgentFailure('runtime_error', 'the pre-copied files the source left out are not all here; the desktop is fetched whole on the next try', true);
  }
  const fetchOptions = {
    transfer,
    desktopId: spec.desktopId,
    url: base,
    ticket: spec.source.ticket,
    reuse: precopyId,
    signal: options.signal,
    onBytes: (n: number) => progress.add(n),
    ...(options.retries === undefined ? {} : { retries: options.retries }),
    ...(options.backoffMs === undefined ? {} : { backoffMs: options.backoffMs }),
  };
  let fetched = 0;
  let resumed = 0;
  const unpacked: string[] = [];
  const take = async (unit: TransferUnit) => {
    const got = await fetchUnit(fetchOptions, unit);
    fetched += got.fetched;
    resumed += got.resumed;
    progress.add(got.resumed);
    unpacked.push(unit.id);
  };

  // Layers not here now are fetched at once; a layer here now waits for the check after the
  // desktop unit (it could be collected before that unit names it).
  const early = new Map<string, Promise<void>>();
  for (const unit of listing.units) {
    if (unit.id === DESKTOP_UNIT || (await transfer.holds(unit.id))) continue;
    const fetching = take(unit);
    // Handled here so that a failure while the desktop unit is still coming is not unhandled;
    // it is thrown below.
    fetching.catch(() => undefined);
    early.set(unit.id, fetching);
  }
  let chain: string[];
  try {
    await take(desktop);
    chain = (await transfer.stagedChain(spec.desktopId)).map(layerUnit);
    if (chain.length !== units.size - 1 || chain.some((id) => !units.has(id))) {
      throw new AgentFailure('runtime_error', `the source's listing does not match the layers ${spec.desktopId} stands on`, false);
    }
  } catch (err) {
    // No fetch is left running behind a failed command (the next attempt resumes what they got).
    await Promise.allSettled(early.values());
    throw err;
  }
  const failed = (await Promise.allSettled(early.values())).find((r) => r.status === 'rejected');
  if (failed !== undefined) throw failed.reason;
  for (const id of chain) {
    const unit = units.get(id)!;
    if (early.has(id)) continue;
    if (await transfer.holds(id)) {
      // Already here (layers never change): counted as held, not fetched.
      resumed += unit.bytes;
      progress.add(unit.bytes);
      continue;
    }
    await take(unit);
  }

  const record = {
    generation: spec.generation,
    ...(spec.operationId === undefined ? {} : { operationId: spec.operationId }),
    units: listing.units.length,
    totalBytes: listing.total_bytes,
  };
  await transfer.install(spec.desktopId, { tier: spec.tier, unpacked, record });
  progress.flush();
  options.log('desktop imported', { desktopId: spec.desktopId, units: listing.units.length, fetched, resumed });
  return { fetched_bytes: fetched, resumed_bytes: resumed, units: listing.units.length };
}

async function fetchListing(options: ImportOptions, url: string, ticket: string): Promise<Listing> {
  const retries = options.retries ?? 5;
  for (let attempt = 0; ; attempt++) {
    try {
      const listing = parseMessage(Listing, await getJson(url, { ticket, idleTimeoutMs: 120_000, signal: options.signal }), 'unit listing');
      if (new Set(listing.units.map((u) => u.id)).size !== listing.units.length) {
        throw new AgentFailure('runtime_error', 'the source listed a unit twice', false);
      }
      return listing;
    } catch (err) {
      const error = classify(err, options.signal);
      if (!(error instanceof TransientFetchError)) throw error;
      if (attempt >= retries) throw new AgentFailure('runtime_error', `listing the units failed after retries: ${error.message}`, true);
      await new Promise((resolve) => setTimeout(resolve, (options.backoffMs ?? 200) * 2 ** attempt));
    }
  }
}

/** Drops what staging holds of units whose hash is not the one listed now. */
/** What the staging records of the attempts before: their listing, and the move they were for. */
type StagedListing = Listing & { operation_id?: string | null };

/**
 * Drops the staged units an earlier attempt left that this one cannot use. A unit is the same
 * while its hash (hashed listings) or its version and size (sized ones) are, and only within one
 * move: a version names the desktop's generation, which a move that rolled back does not bump,
 * so a desktop that ran on at its source and changed a file without changing its size lists a
 * unit another move staged here as its own. (An import of an older scheduler names no move.)
 */
async function forgetChangedUnits(staging: string, listing: Listing, operationId: string | null): Promise<void> {
  const file = join(staging, 'listing.json');
  let previous: StagedListing | null = null;
  try {
    previous = JSON.parse(await readFile(file, 'utf8')) as StagedListing;
  } catch {
    // no earlier attempt
  }
  const sameMove = (previous?.operation_id ?? null) === operationId;
  const identity = (u: TransferUnit) => `${u.sha256 ?? ''}/${u.version ?? ''}/${u.bytes}`;
  const now = new Map(listing.units.map((u) => [u.id, identity(u)]));
  for (const unit of previous?.units ?? []) {
    if (unit.sha256 === undefined && unit.version === undefined) {
      // Nothing names what it held: start over.
    } else if (sameMove && now.get(unit.id) === identity(unit)) continue;
    const { part, done } = unitFiles(staging, unit.id);
    await rm(part, { force: true });
    await rm(done, { force: true });
  }
  // Whole or not at all: a torn record would read as no earlier attempt, and forget nothing.
  const tmp = `${file}.${process.pid}.tmp`;
  await writeFile(tmp, JSON.stringify({ ...listing, operation_id: operationId } satisfies StagedListing));
  await rename(tmp, file);
}

/** Progress notifications, at most one per PROGRESS_MS, and a last one when asked. */
function throttle(send: ImportOptions['progress'], desktopId: string, total: number): { add(n: number): void; flush(): void } {
  let done = 0;
  let last = 0;
  const emit = () => {
    last = performance.now();
    send?.({ desktop_id: desktopId, done_bytes: Math.min(done, total), total_bytes: total });
  };
  return {
    add(n) {
      done += n;
      if (performance.now() - last >= PROGRESS_MS) emit();
    },
    flush: emit,
  };
}
