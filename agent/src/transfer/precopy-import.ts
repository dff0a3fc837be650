/**
 * `desktop.precopy.import` on the target: fetch a pre-copy from the source's transfer server
 * into staging while the desktop still runs there (shared/src/precopy.ts), and how the later
 * import of the stopped desktop knows what it holds.
 *
 * The stream has no length known ahead and is not resumable (the files may change under it): a
 * broken fetch fails the command and the move goes on without it. Only a stream whose sha256
 * matches the source's trailer and that unpacked cleanly is marked (`precopy.json` in staging,
 * with the id and the generation it is for); an agent that stops halfway leaves no mark, and an
 * unmarked pre-copy is never reused. The mark goes first when a new pre-copy begins.
 */
import { createHash } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import { mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { AgentFailure } from '../../../shared/src/protocol.js';
import type { PrecopyImportResult } from '../../../shared/src/precopy.js';
import { SHA256_TRAILER } from '../../../shared/src/transfer.js';
import { sinkDrained, type DesktopTransfer, type PrecopyFiles, type UnitSink } from '../runtime/transfer.js';
import { classify, get, httpUrl } from './client.js';
import { openRawUnit } from './raw-unit.js';

export interface PrecopySpec {
  readonly desktopId: string;
  readonly generation: number;
  readonly precopyId: string;
  readonly source: { readonly url: string; readonly ticket: string };
}

const MARK = 'precopy.json';

interface Mark {
  readonly precopy_id: string;
  readonly generation: number;
}

/** The pre-copy staging holds whole for this generation of the desktop, or null. */
export async function heldPrecopy(transfer: DesktopTransfer, desktopId: string, generation: number): Promise<string | null> {
  if (transfer.precopy === undefined) return null;
  try {
    const mark = JSON.parse(await readFile(join(transfer.stagingDir(desktopId), MARK), 'utf8')) as Mark;
    return mark.generation === generation && typeof mark.precopy_id === 'string' ? mark.precopy_id : null;
  } catch {
    return null;
  }
}

/** Forgets the pre-copy in staging: the import then fetches the desktop whole. */
export async function dropPrecopy(transfer: DesktopTransfer, desktopId: string): Promise<void> {
  await rm(join(transfer.stagingDir(desktopId), MARK), { force: true });
  await transfer.precopy?.drop(desktopId);
}

export async function importPrecopy(
  options: { transfer: DesktopTransfer; signal: AbortSignal; log: (msg: string, fields?: object) => void },
  spec: PrecopySpec,
): Promise<PrecopyImportResult> {
  const { transfer } = options;
  const files: PrecopyFiles | undefined = transfer.precopy;
  if (files === undefined) throw new AgentFailure('unsupported', 'this runtime cannot pre-copy desktops', false);
  const here = await transfer.inspect(spec.desktopId);
  if (here.held) throw new AgentFailure('conflict', `a copy of ${spec.desktopId} is already on this host`, false);
  if ((await heldPrecopy(transfer, spec.desktopId, spec.generation)) === spec.precopyId) return { fetched_bytes: 0 };
  await dropPrecopy(transfer, spec.desktopId);
  const staging = transfer.stagingDir(spec.desktopId);
  await mkdir(staging, { recursive: true });

  const base = spec.source.url.replace(/\/+$/, '');
  const url = `${base}/v1/transfer/${encodeURIComponent(spec.desktopId)}/precopy/${encodeURIComponent(spec.precopyId)}`;
  const sink = await files.unpack(spec.desktopId);
  const hash = createHash('sha256');
  let fetched = 0;
  const getOptions = { ticket: spec.source.ticket, idleTimeoutMs: 30_000, signal: options.signal };
  try {
    // Raw where the source speaks it (raw-unit.ts), the plain chunked stream otherwise.
    const raw = await openRawUnit(httpUrl(url), null, getOptions);
    let trailer: string | null;
    if (raw !== null) {
      trailer = await raw.read((chunk, release) => {
        hash.update(chunk);
        fetched += chunk.length;
        if (sink.input.write(chunk, () => release())) return null;
        return sinkDrained(sink).then((stopped) => {
          if (stopped !== null) throw stopped;
        });
      });
    } else {
      const res = await get(url, getOptions);
      await readPlain(res, sink, (chunk) => {
        hash.update(chunk);
        fetched += chunk.length;
      }, options.signal);
      const said = res.trailers[SHA256_TRAILER];
      trailer = typeof said === 'string' ? said : null;
    }
    const digest = hash.digest('hex');
    if (trailer !== digest) throw new AgentFailure('runtime_error', `the pre-copy's sha256 does not match (${trailer !== null ? 'got another' : 'none came'})`, true);
    sink.input.end();
    await sink.done;
  } catch (err) {
    sink.abort();
    await sink.done.catch(() => undefined);
    await dropPrecopy(transfer, spec.desktopId);
    throw err instanceof AgentFailure ? err : new AgentFailure('runtime_error', `the pre-copy failed: ${err instanceof Error ? err.message : String(err)}`, true);
  }
  await writeFile(join(staging, MARK), JSON.stringify({ precopy_id: spec.precopyId, generation: spec.generation } satisfies Mark));
  options.log('pre-copy imported', { desktopId: spec.desktopId, bytes: fetched });
  return { fetched_bytes: fetched };
}

/**
 * Reads a plain answer into the unpacking: 'data' events and a pause while the unpacking is full,
 * not an async iterator (which concatenates what is buffered, a copy of every byte).
 */
function readPlain(res: IncomingMessage, sink: UnitSink, seen: (chunk: Buffer) => void, signal: AbortSignal): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    let settled = false;
    const fail = (err: unknown) => {
      if (settled) return;
      settled = true;
      res.destroy();
      reject(classify(err, signal));
    };
    const done = () => {
      settled = true;
      resolve();
    };
    sink.done.then(() => fail(new Error('the unpacking ended early')), fail);
    res.on('data', (chunk: Buffer) => {
      seen(chunk);
      if (sink.input.write(chunk)) return;
      res.pause();
      sink.input.once('drain', () => res.resume());
    });
    res.once('end', done);
    res.once('error', fail);
    res.once('close', () => (res.complete ? done() : fail(new Error('the pre-copy stream was cut'))));
  });
}
