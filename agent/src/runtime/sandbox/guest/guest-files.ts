/**
 * Guest file operations: each is one call of the guest helper inside the desktop (see
 * guest-helper.ts for what runs there and guest-call.ts for how it gets there). This module checks
 * the arguments, frames upload data, and turns the helper's replies into the driver's types.
 *
 * Streaming: a read returns as soon as the helper has opened the file and reported its size; the
 * body then flows from the helper's stdout as the consumer pulls it, or, from 128 KiB on, from the
 * agent's own descriptor of the helper's file (guest-handoff.ts), in 1 MiB pieces with the next
 * one read while the last is sent. A replacing write is handed off the same way: the agent writes
 * into the helper's anonymous temporary and the helper commits it.
 * An append is sent to the helper one chunk at a time, each written only after the previous one
 * has drained, so the agent never holds more than the chunk it was given. Names are bytes in the
 * guest and strings here: they are decoded as UTF-8, and a name that is not valid UTF-8 comes out
 * with U+FFFD in place of the bad bytes.
 */
import { AgentFailure } from '../../../../../shared/src/protocol.js';
import { FILE_TYPES } from '../../../../../shared/src/guest-commands.js';
import type { DirEntry, DirListing, FileRead, FileReadSpec, FileStat, FileType, FileWriteSpec } from '../../driver.js';
import { GuestCall, type GuestTarget } from './guest-call.js';
import { BatchedWriter, openHandedFile, parseHandedFile, type HandedFile } from './guest-handoff.js';
import { MAX_APPEND_BYTES } from './guest-helper.js';

/** Deadline of a metadata operation (stat, list, delete) and of the status line of a read. */
const META_MS = 30_000;
/** After an upload's last byte, the helper has this long to rename or append. */
const COMMIT_MS = 30_000;
/** A read whose consumer (or helper) makes no progress for this long is ended. */
const BODY_IDLE_MS = 60_000;
/**
 * Reads of at least this many bytes are handed off (guest-handoff.ts): below it, the helper's pipe
 * is cheaper than the agent's extra checks and open.
 */
export const HANDOFF_READ_MIN_BYTES = 128 * 1024;
/**
 * A handed-off read moves the file in pieces of this size: each costs a thread-pool round trip
 * and a link message, so fewer are cheaper, while the link and the response still overlap.
 */
const HANDOFF_PIECE_BYTES = 1024 * 1024;
/** A listing reply: 2000 entries of at most 255-byte names fit many times over. */
const MAX_LISTING_BYTES = 64 * 1024 * 1024;

function badRequest(message: string): AgentFailure {
  return new AgentFailure('bad_request', message, false);
}

function malformed(): AgentFailure {
  return new AgentFailure('runtime_error', 'guest helper sent a malformed reply', true);
}

/** The caller normalizes paths; this is the driver's own check that it did. */
export function assertGuestPath(path: string): void {
  const ok =
    typeof path === 'string' &&
    path.startsWith('/') &&
    !path.includes('\0') &&
    (path === '/' || path.slice(1).split('/').every((s) => s !== '' && s !== '.' && s !== '..'));
  if (!ok) throw badRequest(`invalid guest path ${JSON.stringify(path)}`);
}

function assertCount(value: number, what: string): void {
  if (!Number.isSafeInteger(value) || value < 0) throw badRequest(`invalid ${what} ${String(value)}`);
}

function count(text: string | undefined): number {
  if (text === undefined || !/^[0-9]{1,16}$/.test(text)) throw malformed();
  return Number(text);
}

function fileType(text: string | undefined): FileType {
  const known: readonly string[] = FILE_TYPES;
  if (text !== undefined && known.includes(text)) return text as FileType;
  throw malformed();
}

/** Milliseconds since the epoch as ISO 8601; a time outside Date's range is clamped to it. */
function isoTime(text: string | undefined): string {
  if (text === undefined || !/^-?[0-9]{1,20}$/.test(text)) throw malformed();
  const ms = Math.max(-8.64e15, Math.min(8.64e15, Number(text)));
  return new Date(ms).toISOString();
}

export async function statGuest(target: GuestTarget, path: string): Promise<FileStat> {
  assertGuestPath(path);
  const call = await GuestCall.start(target, 'stat', [path], { timeoutMs: META_MS });
  const [type, size, mtime, mode] = await call.status();
  if (mode === undefined || !/^[0-7]{1,4}$/.test(mode)) throw malformed();
  return { fileType: fileType(type), sizeBytes: count(size), modifiedAt: isoTime(mtime), mode };
}

export async function listGuest(target: GuestTarget, path: string, limit: number): Promise<DirListing> {
  assertGuestPath(path);
  assertCount(limit, 'limit');
  const call = await GuestCall.start(target, 'list', [path, String(limit)], { timeoutMs: META_MS });
  const [truncated] = await call.status();
  if (truncated !== '0' && truncated !== '1') throw malformed();
  const data = await call.rest(MAX_LISTING_BYTES);
  const entries: DirEntry[] = [];
  for (let start = 0; start < data.length; ) {
    const end = data.indexOf(0, start);
    if (end < 0) throw malformed();
    const record = data.subarray(start, end);
    start = end + 1;
    // `<type> <size> <mtime> <name>`: the name is last because it may hold spaces and newlines.
    const fields: string[] = [];
    let at = 0;
    for (let i = 0; i < 3; i++) {
      const sp = record.indexOf(0x20, at);
      if (sp < 0) throw malformed();
      fields.push(record.subarray(at, sp).toString('latin1'));
      at = sp + 1;
    }
    const name = record.subarray(at).toString('utf8');
    if (name === '') throw malformed();
    entries.push({ name, fileType: fileType(fields[0]), sizeBytes: count(fields[1]), modifiedAt: isoTime(fields[2]) });
  }
  return { entries, truncated: truncated === '1' };
}

export async function readGuest(target: GuestTarget, spec: FileReadSpec): Promise<FileRead> {
  assertGuestPath(spec.path);
  assertCount(spec.maxWholeBytes, 'maxWholeBytes');
  if (spec.offset !== null) {
    assertCount(spec.offset, 'offset');
    assertCount(spec.length, 'length');
  }
  const offset = spec.offset === null ? '-' : String(spec.offset);
  const length = spec.offset === null ? '0' : String(spec.length);
  const args = [spec.path, offset, length, String(spec.maxWholeBytes), String(HANDOFF_READ_MIN_BYTES)];
  const call = await GuestCall.start(target, 'read', args, { timeoutMs: META_MS });
  const [sizeText, lengthText, ...handed] = await call.status();
  const size = count(sizeText);
  const bytes = count(lengthText);
  const from = spec.offset ?? 0;
  if (bytes > size || (spec.offset !== null && bytes > spec.length)) throw malformed();
  const body = handed.length === 0 ? call.body(bytes, BODY_IDLE_MS) : handedBody(call, parseHandedFile(handed), from, bytes);
  return { size, length: bytes, eof: from + bytes >= size, body };
}

/**
 * The body of a handed-off read: the agent's own descriptor of the helper's file, read from
 * `from`. The helper waits meanwhile (its registration in flight lasts as long), and is let go when
 * the body ends; a stop that kills the call closes the descriptor first.
 */
function handedBody(call: GuestCall, file: HandedFile, from: number, length: number): AsyncGenerator<Buffer> {
  const handle = openHandedFile(call.handoffScope(), file, 'read');
  let closed = false;
  const close = () => {
    closed = true;
    handle.close();
  };
  call.holdUntilKilled(async () => close());
  call.arm(BODY_IDLE_MS);
  async function* pieces(): AsyncGenerator<Buffer> {
    const end = from + length;
    let at = from;
    let complete = false;
    // One piece is read ahead while the consumer sends the last one: the file's reads (a
    // thread-pool round trip each) overlap the link's sends instead of alternating with them.
    let ahead: Promise<Buffer> | null = null;
    const readPiece = async (): Promise<Buffer> => {
      if (closed || call.isFinished) throw call.shortBody();
      const want = Math.min(HANDOFF_PIECE_BYTES, end - at);
      const buffer = Buffer.allocUnsafe(want);
      const start = at;
      at += want;
      for (let got = 0; got < want; ) {
        const bytesRead = await handle.read(buffer.subarray(got), start + got);
        // The file shrank under the read: the consumer gets a short body.
        if (bytesRead === 0) throw call.shortBody();
        got += bytesRead;
      }
      call.arm(BODY_IDLE_MS);
      return buffer;
    };
    try {
      if (length > 0) ahead = readPiece();
      while (ahead !== null) {
        const piece = await ahead;
        ahead = at < end ? readPiece() : null;
        // A read ahead that fails while its piece is still being sent is seen at the next turn.
        ahead?.catch(() => undefined);
        yield piece;
      }
      complete = true;
    } finally {
      close();
      // The helper exits once its input ends; a body left unfinished kills it instead.
      if (complete) {
        call.stdin.end();
        call.arm(META_MS);
      } else {
        await call.kill();
      }
    }
  }
  return pieces();
}

const REPLIED: unique symbol = Symbol('replied');

/**
 * A replacing write is handed off (writeHandedOff). An append streams `body` to the helper as
 * length-prefixed chunks and commits with a zero-length one. If the body throws, stdin is closed
 * without the commit marker, so the helper throws its work away, and the body's own error is
 * rethrown. If the helper answers early (an error before the data is all sent), sending stops and
 * its answer is the result.
 */
export async function writeGuest(target: GuestTarget, spec: FileWriteSpec, body: AsyncIterable<Buffer>): Promise<void> {
  assertGuestPath(spec.path);
  if (spec.appendAt === null) return writeHandedOff(target, spec.path, body);
  assertCount(spec.appendAt, 'append offset');
  const at = String(spec.appendAt);
  const call = await GuestCall.start(target, 'write', [spec.path, at, String(MAX_APPEND_BYTES)], { timeoutMs: null });
  const status = call.status();
  const replied: Promise<typeof REPLIED> = status.then(
    () => REPLIED,
    () => REPLIED,
  );
  const it = body[Symbol.asyncIterator]();
  let bodyError: { error: unknown } | null = null;
  let committed = false;
  try {
    for (;;) {
      const next = it.next();
      next.catch(() => undefined); // it may lose the race below and fail later, unobserved
      const step = await Promise.race([next, replied]);
      if (step === REPLIED) break;
      if (step.done) {
        committed = await call.send('0\n');
        break;
      }
      const chunk = step.value;
      if (chunk.length === 0) continue;
      void call.send(`${chunk.length}\n`);
      if (!(await call.send(chunk))) break;
    }
  } catch (error) {
    bodyError = { error };
  } finally {
    call.stdin.end();
    if (!committed) void Promise.resolve(it.return?.()).catch(() => undefined);
  }
  call.arm(COMMIT_MS);
  if (bodyError !== null) {
    await status.catch(() => undefined);
    throw bodyError.error;
  }
  await status;
}

/**
 * A replacing write, handed off: the helper opens the anonymous temporary and names it; the agent
 * writes the body straight into it and sends the commit marker, and the helper swaps it in. A body
 * that throws (or a stop) kills the helper before the marker, so the temporary vanishes with it.
 */
async function writeHandedOff(target: GuestTarget, path: string, body: AsyncIterable<Buffer>): Promise<void> {
  const call = await GuestCall.start(target, 'write', [path, '-', String(MAX_APPEND_BYTES), 'h'], { timeoutMs: META_MS });
  const handle = openHandedFile(call.handoffScope(), parseHandedFile(await call.status()), 'write');
  let closed = false;
  const close = () => {
    closed = true;
    handle.close();
  };
  call.holdUntilKilled(async () => close());
  // The body may come as slowly as its sender pleases; the deadline is the commit's, set below.
  call.disarm();
  // A stop (or the guest) may end the helper while the body is waiting for its sender.
  const gone: Promise<typeof REPLIED> = call.whenFinished().then(() => REPLIED);
  const it = body[Symbol.asyncIterator]();
  const writer = new BatchedWriter(handle);
  try {
    for (;;) {
      const next = it.next();
      next.catch(() => undefined); // it may lose the race below and fail later, unobserved
      const step = await Promise.race([next, gone]);
      if (step === REPLIED || closed) throw call.shortBody();
      if (step.done) break;
      writer.write(step.value);
    }
    await writer.flush();
    close();
  } catch (error) {
    void Promise.resolve(it.return?.()).catch(() => undefined);
    close();
    await call.kill();
    throw error;
  }
  await call.send('0\n');
  call.stdin.end();
  call.arm(COMMIT_MS);
  await call.status();
}

export async function deleteGuest(target: GuestTarget, path: string, recursive: boolean): Promise<void> {
  assertGuestPath(path);
  if (path === '/') throw badRequest('cannot delete the root');
  const call = await GuestCall.start(target, 'delete', [path, recursive ? '1' : '0'], { timeoutMs: META_MS });
  await call.status();
}
