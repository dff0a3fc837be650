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
 * The hash of the whole stream must equal the listing's, and the source's trailer when one came
 * (under a sized listing, which names no hash, the trailer alone).
 * If not, or if the unpacking fails (a corrupt stream is the likely cause), the spool and the
 * unpacked files are dropped and the command fails retryable: the next try starts that unit over.
 * A unit done is marked `<unit>.done` (its spool is no longer needed) so it is never fetched again.
 */
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { open, readFile, rm, stat, writeFile, type FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { AgentFailure } from '../../../shared/src/protocol.js';
import { SHA256_TRAILER, type TransferUnit } from '../../../shared/src/transfer.js';
import type { IncomingMessage } from 'node:http';
import { sinkDrained, type DesktopTransfer, type UnitSink } from '../runtime/transfer.js';
import { classify, get, httpUrl, RangeRefused, TransientFetchError } from './client.js';
import { openRawUnit, type RawUnitBody } from './raw-unit.js';

export interface UnitFetchOptions {
  readonly transfer: DesktopTransfer;
  readonly desktopId: string;
  /** `http://host:port` of the source's transfer server. */
  readonly url: string;
  readonly ticket: string;
  /** The pre-copy this host holds (`?reuse=` on every request), or null. */
  readonly reuse?: string | null;
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
  if (await markedInThisBoot(done)) return { fetched: 0, resumed: unit.bytes };
  let resumed = (await stat(part).catch(() => null))?.size ?? 0;
  if (resumed > unit.bytes) {
    await rm(part, { force: true });
    resumed = 0;
  }
  // The first request goes out before the unpacking starts (a process to spawn, pre-copied files
  // to link): the source starts producing the unit meanwhile.
  let sent!: () => void;
  const gone = new Promise<void>((resolve) => (sent = resolve));
  const via: Via = { plain: false };
  let early: Promise<UnitResponse> | null = resumed < unit.bytes ? requestRest(options, unit, resumed, via, sent) : null;
  if (early !== null) {
    early.catch(() => undefined);
    await Promise.race([gone, early.then(() => undefined, () => undefined)]);
  }
  let sink: UnitSink | undefined;
  let file: FileHandle;
  try {
    sink = await options.transfer.unpack(options.desktopId, unit.id, unit.reuse?.paths);
    file = await open(part, 'a');
  } catch (err) {
    void early?.then(destroy, () => undefined);
    sink?.abort();
    throw err;
  }
  const spool = new Spool(file, sink);
  let trailer: string | null = null;
  try {
    if (resumed > 0) {
      for await (const chunk of createReadStream(part, { end: resumed - 1, highWaterMark: BATCH_BYTES }) as AsyncIterable<Buffer>) {
        await spool.replay(chunk);
      }
    }
    let failures = 0;
    while (spool.held < unit.bytes) {
      try {
        const response = early ?? requestRest(options, unit, spool.held, via);
        early = null;
        trailer = await readRest(response, unit, spool.held, (chunk, release) => spool.take(chunk, options.onBytes, release));
        await spool.flush();
        if (spool.held < unit.bytes) throw new TransientFetchError(`the source ended ${unit.id} at ${spool.held} of ${unit.bytes} bytes`);
      } catch (err) {
        // What did arrive is good: the next request asks for what follows it.
        await spool.flush();
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
    // A sized listing names no hash: the source's trailer is the only word on the bytes. A spool
    // found whole (the agent stopped before marking it done) has no trailer yet: the empty rest
    // of the unit brings one, the hash of the whole stream as the source produces it now.
    if (unit.sha256 === undefined && trailer === null) {
      trailer = await readRest(requestRest(options, unit, spool.held, via), unit, spool.held, () => {
        throw new BadUnit(`the source sent more of ${unit.id} than listed`);
      });
    }
    const expected = unit.sha256 ?? trailer;
    const digest = spool.digest();
    if (expected === null || digest !== expected || (trailer !== null && trailer !== expected)) {
      const said = expected === null ? 'no hash came with it' : `expected ${expected.slice(0, 12)}…`;
      throw new BadUnit(`sha256 of ${unit.id} does not match (got ${digest.slice(0, 12)}…, ${said})`);
    }
    // The unpacking ends as soon as the bytes are all here and good; the spool's last writes run
    // meanwhile. It must hold the whole unit before the unit is marked done (a failed write says
    // so here).
    sink.input.end();
    await spool.written();
    try {
      await sink.done;
    } catch (err) {
      throw new BadUnit(`unpacking ${unit.id} failed: ${err instanceof Error ? err.message : String(err)}`);
    }
  } catch (err) {
    void early?.then(destroy, () => undefined);
    sink.abort();
    await sink.done.catch(() => undefined);
    await spool.close();
    if (err instanceof BadUnit) {
      await rm(part, { force: true });
      throw new AgentFailure('runtime_error', `${err.message}; it is fetched again on the next try`, true);
    }
    if (err instanceof TransientFetchError) {
      throw new AgentFailure('runtime_error', `fetching ${unit.id} failed after retries: ${err.message}`, true);
    }
    throw err;
  }
  await spool.close();
  await writeFile(done, await bootId());
  await rm(part, { force: true });
  return { fetched: spool.held - resumed, resumed };
}

/**
 * Whether the unit is marked done, in this boot of the machine. The unpacked files are written to
 * disk only at the install (one syncfs for them all, sandbox-transfer.ts), not before the mark:
 * that would add a flush per unit to a move's downtime. A crash of the agent leaves them in the
 * page cache, whole; a power loss may not, so a mark from an earlier boot is not trusted and the
 * unit is fetched again (its spool is gone; nothing else of it is kept).
 */
async function markedInThisBoot(done: string): Promise<boolean> {
  const mark = await readFile(done, 'utf8').catch(() => null);
  if (mark === null) return false;
  if (mark === (await bootId())) return true;
  await rm(done, { force: true });
  return false;
}

let currentBoot: Promise<string> | null = null;

/** This boot of the machine (the kernel's random boot id); a fixed word where there is none to read. */
function bootId(): Promise<string> {
  currentBoot ??= readFile('/proc/sys/kernel/random/boot_id', 'utf8').then((id) => id.trim(), () => 'unknown-boot');
  return currentBoot;
}

/** Bytes gathered before they are written on: a few large writes cost far less than many small ones. */
const BATCH_BYTES = 1 << 20;
/**
 * How far the spool file and the unpacking may fall behind the network before the fetch waits
 * for them. Waiting on every batch instead (for the file write, and for tar's 64 KiB pipe to
 * drain) ran the network, the disk and tar in lockstep with idle gaps between: an import of
 * 125 MiB took 1.1–1.3 s with both processes mostly idle, and 0.7 s with this much slack.
 */
const SLACK_BYTES = 16 * BATCH_BYTES;

/**
 * Where a unit's bytes go: the hash, the spool file and the unpacking. Network chunks (a few KiB
 * to 64 KiB) are gathered into batches of about 1 MiB first. Spool writes run one after another
 * behind the network, so the file is always a prefix of the unit (what a later command resumes
 * from); a failed write fails the next flush.
 */
class Spool {
  private readonly hash = createHash('sha256');
  private batch: Buffer[] = [];
  private batchBytes = 0;
  /** What hands the batch's buffers back to their reader, once both writes are done with them. */
  private releases: Array<() => void> = [];
  /** The spool writes queued so far, in order. */
  private appending: Promise<void> = Promise.resolve();
  private appendFailure: unknown = null;
  /** Bytes handed to the spool file and not yet written. */
  private unwritten = 0;
  /** Bytes taken: those in the spool file, queued for it, and in the batch being gathered. */
  held = 0;

  constructor(
    private readonly file: FileHandle,
    private readonly sink: UnitSink,
  ) {}

  /** A chunk already in the spool file (a partial unit from before): hashed and unpacked only. */
  async replay(chunk: Buffer): Promise<void> {
    this.hash.update(chunk);
    this.held += chunk.length;
    await this.unpack([chunk]);
  }

  /**
   * Takes a network chunk (and, for a buffer its reader uses again, what hands it back); answers
   * a promise only when a batch is being handed on.
   */
  take(chunk: Buffer, onBytes: (n: number) => void, release?: () => void): Promise<void> | null {
    this.hash.update(chunk);
    this.batch.push(chunk);
    if (release !== undefined) this.releases.push(release);
    this.batchBytes += chunk.length;
    this.held += chunk.length;
    onBytes(chunk.length);
    return this.batchBytes >= BATCH_BYTES ? this.flush() : null;
  }

  /** Hands the batch on to the spool file and the unpacking; waits only when they fall behind. */
  async flush(): Promise<void> {
    if (this.appendFailure !== null) throw this.appendFailure;
    if (this.batchBytes === 0) return;
    // Written as they came, with one writev each: joining them first would copy every byte.
    const chunks = this.batch;
    const bytes = this.batchBytes;
    const releases = this.releases;
    this.batch = [];
    this.batchBytes = 0;
    this.releases = [];
    // The buffers go back after the spool file and the unpacking both wrote them (or failed to).
    let writers = 2;
    const written = () => {
      if (--writers === 0) for (const release of releases) release();
    };
    this.unwritten += bytes;
    this.appending = this.appending.then(async () => {
      try {
        if (this.appendFailure === null) await this.append(chunks);
      } catch (err) {
        this.appendFailure = err;
      } finally {
        this.unwritten -= bytes;
        written();
      }
    });
    await this.unpack(chunks, written);
    if (this.unwritten > SLACK_BYTES) await this.written();
  }

  /** Every queued spool write done; throws the first that failed. */
  async written(): Promise<void> {
    await this.appending;
    if (this.appendFailure !== null) throw this.appendFailure;
  }

  digest(): string {
    return this.hash.digest('hex');
  }

  async close(): Promise<void> {
    await this.appending;
    await this.file.close();
  }

  /** Appends to the spool; a local failure (a full disk) is no reason to fetch again at once. */
  private async append(chunks: Buffer[]): Promise<void> {
    try {
      await this.file.writev(chunks);
    } catch (err) {
      throw new AgentFailure('runtime_error', `cannot write the unit on this host: ${err instanceof Error ? err.message : String(err)}`, true);
    }
  }

  /**
   * Writes to the unpacking's input, waiting while it holds too much; fails if the unpacking
   * stopped. `written` is called once the input is done with the chunks.
   */
  private async unpack(chunks: Buffer[], written?: () => void): Promise<void> {
    const { input } = this.sink;
    input.cork();
    chunks.forEach((chunk, i) => input.write(chunk, i === chunks.length - 1 ? written : undefined));
    input.uncork();
    if (input.writableLength <= SLACK_BYTES) return;
    const error = await sinkDrained(this.sink);
    if (error !== null) throw new BadUnit(`unpacking failed: ${error.message}`);
  }
}

/** A unit whose bytes are wrong: its spool must go. */
class BadUnit extends Error {}

/** How the source answers: raw (raw-unit.ts) until it shows it cannot, then plain HTTP. */
interface Via {
  plain: boolean;
}

type UnitResponse = { readonly raw: RawUnitBody } | { readonly plain: IncomingMessage };

function destroy(response: UnitResponse): void {
  if ('raw' in response) response.raw.destroy();
  else response.plain.destroy();
}

/** One request for the unit from `offset` (`onSent`: it has gone out). */
async function requestRest(options: UnitFetchOptions, unit: TransferUnit, offset: number, via: Via, onSent?: () => void): Promise<UnitResponse> {
  const reuse = options.reuse === null || options.reuse === undefined ? '' : `&reuse=${options.reuse}`;
  const path = `/v1/transfer/${encodeURIComponent(options.desktopId)}/units/${encodeURIComponent(unit.id)}?offset=${offset}${reuse}`;
  const url = `${options.url.replace(/\/+$/, '')}${path}`;
  const getOptions = { ticket: options.ticket, idleTimeoutMs: options.idleTimeoutMs ?? 30_000, signal: options.signal };
  if (!via.plain) {
    const raw = await openRawUnit(httpUrl(url), offset, getOptions, onSent);
    if (raw !== null) return { raw };
    via.plain = true;
  }
  return { plain: await get(url, getOptions, onSent) };
}

/**
 * Reads the response to a request for the unit from `offset`; `onChunk` takes each chunk in
 * order (with what hands its buffer back, for a raw one) and answers a promise only when the
 * next chunk must wait for it. Resolves with the source's hash of the whole stream (the raw
 * stream's digest or the plain one's trailer) once the response is complete; rejects when the
 * connection breaks.
 */
async function readRest(
  response: Promise<UnitResponse>,
  unit: TransferUnit,
  offset: number,
  onChunk: (chunk: Buffer, release?: () => void) => Promise<void> | null,
): Promise<string | null> {
  const got = await response;
  if ('raw' in got) {
    // A unit asked for from an offset is always answered with its size.
    if (got.raw.unitBytes! > unit.bytes) {
      got.raw.destroy();
      throw new BadUnit(`the source sent more of ${unit.id} than listed`);
    }
    return got.raw.read(onChunk);
  }
  const res = got.plain;
  let received = offset;
  let waiting: Promise<void> = Promise.resolve();
  // 'data' events, not an async iterator: the iterator concatenates what is buffered, a copy of
  // every byte.
  await new Promise<void>((resolve, reject) => {
    let failed = false;
    const fail = (err: unknown) => {
      if (failed) return;
      failed = true;
      res.destroy();
      reject(err);
    };
    res.on('data', (chunk: Buffer) => {
      if (failed) return;
      received += chunk.length;
      if (received > unit.bytes) return fail(new BadUnit(`the source sent more of ${unit.id} than listed`));
      const pending = onChunk(chunk);
      if (pending === null) return;
      res.pause();
      waiting = pending.then(() => {
        if (!failed) res.resume();
      }, fail);
    });
    res.once('end', () => void waiting.then(() => (failed ? undefined : resolve())));
    res.once('error', fail);
    res.once('close', () => {
      if (!res.complete) fail(new TransientFetchError('the connection closed before the unit ended'));
    });
    // The first request's response may have broken off while the unpacking was being set up,
    // before anything here listened: its close has been and gone.
    if (res.destroyed && !res.complete) fail(new TransientFetchError('the connection closed before the unit ended'));
  });
  const trailer = res.trailers[SHA256_TRAILER];
  return typeof trailer === 'string' ? trailer : null;
}
