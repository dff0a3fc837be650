/**
 * Fetching one unit into staging, resumable at a byte offset, verified by SHA-256.
 *
 * The bytes go three ways as they arrive: appended to the unit's spool file
 * (`<staging>/<unit>.part`), into the hash, and into the driver's unpacking of the unit, so the
 * unit is unpacked by the time its last byte is in and nothing reads it a second time. When the
 * connection breaks, the next request asks for `?offset=<bytes held>` and the unpacking simply
 * goes on receiving. A later command finding a partial spool (the agent restarted, the scheduler
 * sent the import again) replays the spool into a fresh unpacking, then fetches the rest.
 *
 * The hash of the whole stream must equal the listing's, and the source's trailer when one came.
 * If not, or if the unpacking fails (a corrupt stream is the likely cause), the spool and the
 * unpacked files are dropped and the command fails retryable: the next try starts that unit over.
 * A unit done is marked `<unit>.done` (its spool is no longer needed) so it is never fetched again.
 */
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { open, rm, stat, writeFile, type FileHandle } from 'node:fs/promises';
import { once } from 'node:events';
import { join } from 'node:path';
import { PassThrough } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { AgentFailure } from '../../../shared/src/protocol.js';
import { SHA256_TRAILER, type TransferUnit } from '../../../shared/src/transfer.js';
import type { DesktopTransfer } from '../runtime/transfer.js';
import { classify, get, RangeRefused, TransientFetchError } from './client.js';

export interface UnitFetchOptions {
  readonly transfer: DesktopTransfer;
  readonly desktopId: string;
  /** `http://host:port` of the source's transfer server. */
  readonly url: string;
  readonly ticket: string;
  /** Told of every byte fetched from the network. */
  readonly onBytes: (n: number) => void;
  readonly signal: AbortSignal;
  /** Requests after the first one that broke, per unit. Default 5. */
  readonly retries?: number;
  /** The first retry's delay; it doubles each time. Default 200 ms. */
  readonly backoffMs?: number;
  /** A response silent this long counts as broken. Default 30 000 ms. */
  readonly idleTimeoutMs?: number;
}

export interface UnitFetched {
  /** Bytes this call fetched from the network. */
  readonly fetched: number;
  /** Bytes held before this call (a finished unit's whole size, or a partial spool's). */
  readonly resumed: number;
}

/** The staging files of a unit. */
export function unitFiles(staging: string, unitId: string): { part: string; done: string } {
  return { part: join(staging, `${unitId}.part`), done: join(staging, `${unitId}.done`) };
}

export async function fetchUnit(options: UnitFetchOptions, unit: TransferUnit): Promise<UnitFetched> {
  const staging = options.transfer.stagingDir(options.desktopId);
  const { part, done } = unitFiles(staging, unit.id);
  if (await exists(done)) return { fetched: 0, resumed: unit.bytes };
  let held = (await stat(part).catch(() => null))?.size ?? 0;
  if (held > unit.bytes) {
    await rm(part, { force: true });
    held = 0;
  }
  const resumed = held;
  const feed = new PassThrough({ highWaterMark: 1 << 20 });
  const unpacking = options.transfer.unpack(options.desktopId, unit.id, feed);
  // Settles (with the reason) if the unpacking stops before its input does.
  const unpackStopped = unpacking.then(
    () => new Error('the unpacking ended before its input'),
    (err: unknown) => (err instanceof Error ? err : new Error(String(err))),
  );
  const hash = createHash('sha256');
  const file = await open(part, 'a');
  let trailer: string | null = null;
  let fetched = 0;
  try {
    for await (const chunk of createReadStream(part) as AsyncIterable<Buffer>) {
      hash.update(chunk);
      await feedWrite(feed, chunk, unpackStopped);
    }
    let failures = 0;
    while (held < unit.bytes) {
      try {
        trailer = await fetchRest(options, unit, held, async (chunk) => {
          hash.update(chunk);
          await Promise.all([writeHere(file, chunk), feedWrite(feed, chunk, unpackStopped)]);
          held += chunk.length;
          fetched += chunk.length;
          options.onBytes(chunk.length);
        });
        if (held < unit.bytes) throw new TransientFetchError(`the source ended ${unit.id} at ${held} of ${unit.bytes} bytes`);
      } catch (err) {
        if (err instanceof BadUnit) throw err;
        const error = classify(err, options.signal);
        if (error instanceof RangeRefused) throw new BadUnit(`the source's ${unit.id} is shorter than listed`);
        if (!(error instanceof TransientFetchError) || failures >= (options.retries ?? 5)) throw error;
        failures++;
        await sleep((options.backoffMs ?? 200) * 2 ** (failures - 1), undefined, { signal: options.signal }).catch(() => {
          throw classify(err, options.signal);
        });
      }
    }
    const digest = hash.digest('hex');
    if (digest !== unit.sha256 || (trailer !== null && trailer !== unit.sha256)) {
      throw new BadUnit(`sha256 of ${unit.id} does not match (got ${digest.slice(0, 12)}…, listed ${unit.sha256.slice(0, 12)}…)`);
    }
    feed.end();
    try {
      await unpacking;
    } catch (err) {
      throw new BadUnit(`unpacking ${unit.id} failed: ${err instanceof Error ? err.message : String(err)}`);
    }
  } catch (err) {
    feed.destroy();
    await unpacking.catch(() => undefined);
    await file.close();
    if (err instanceof BadUnit) {
      await rm(part, { force: true });
      throw new AgentFailure('runtime_error', `${err.message}; it is fetched again on the next try`, true);
    }
    if (err instanceof TransientFetchError) {
      throw new AgentFailure('runtime_error', `fetching ${unit.id} failed after retries: ${err.message}`, true);
    }
    throw err;
  }
  await file.close();
  await writeFile(done, '');
  await rm(part, { force: true });
  return { fetched, resumed };
}

/** A unit whose bytes are wrong: its spool must go. */
class BadUnit extends Error {}

/**
 * One request for the unit from `offset`; `onChunk` takes each chunk in order. Resolves with the
 * trailer once the response is complete; rejects when the connection breaks.
 */
async function fetchRest(
  options: UnitFetchOptions,
  unit: TransferUnit,
  offset: number,
  onChunk: (chunk: Buffer) => Promise<void>,
): Promise<string | null> {
  const path = `/v1/transfer/${encodeURIComponent(options.desktopId)}/units/${encodeURIComponent(unit.id)}?offset=${offset}`;
  const res = await get(`${options.url.replace(/\/+$/, '')}${path}`, {
    ticket: options.ticket,
    idleTimeoutMs: options.idleTimeoutMs ?? 30_000,
    signal: options.signal,
  });
  let received = offset;
  try {
    for await (const chunk of res as AsyncIterable<Buffer>) {
      received += chunk.length;
      if (received > unit.bytes) throw new BadUnit(`the source sent more of ${unit.id} than listed`);
      await onChunk(chunk);
    }
  } finally {
    res.destroy();
  }
  if (!res.complete) throw new TransientFetchError('the connection closed before the unit ended');
  const trailer = res.trailers[SHA256_TRAILER];
  return typeof trailer === 'string' ? trailer : null;
}

/** Appends to the spool; a local failure (a full disk) is no reason to fetch again at once. */
async function writeHere(file: FileHandle, chunk: Buffer): Promise<void> {
  try {
    await file.write(chunk);
  } catch (err) {
    throw new AgentFailure('runtime_error', `cannot write the unit on this host: ${err instanceof Error ? err.message : String(err)}`, true);
  }
}

/** Writes to the unpacking's input, waiting while it is full; fails if the unpacking stopped. */
async function feedWrite(feed: PassThrough, chunk: Buffer, stopped: Promise<Error>): Promise<void> {
  if (feed.write(chunk)) return;
  const drained = once(feed, 'drain').then(() => null);
  const error = await Promise.race([drained, stopped]);
  if (error !== null) throw new BadUnit(`unpacking failed: ${error.message}`);
}

async function exists(path: string): Promise<boolean> {
  return stat(path).then(
    () => true,
    () => false,
  );
}
