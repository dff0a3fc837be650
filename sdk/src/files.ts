/**
 * Files inside an awake desktop (docs/api.md §4.4) move as raw bytes, not JSON: uploads send the caller's
 * bytes as they come (a web ReadableStream, a Node Readable or any async iterable of chunks,
 * a Blob, or a buffer in memory) and downloads hand back the response body as a stream, so
 * neither end holds a whole file it does not need to. A buffer is sent again after a 503; a
 * stream cannot be, so its upload is tried once (retry.ts) and a caller who wants retries
 * sends a buffer or appends in chunks, which docs/api.md §4.4 makes retry-safe.
 */
import type { Client } from 'openapi-fetch';
import type { components, paths } from './generated/api.js';
import { ConflictProblem, NotFoundProblem } from './problem.js';
import { ONE_SHOT_BODY } from './retry.js';

export type FileStat = components['schemas']['FileStatJson'];
export type DirListing = components['schemas']['ListDirResponse'];

/** What `upload` accepts. A Node `Readable` is an `AsyncIterable<Buffer>`. */
export type UploadBody = Uint8Array | ArrayBuffer | string | Blob | ReadableStream<Uint8Array> | AsyncIterable<Uint8Array | string>;

export interface UploadOptions {
  /** Append instead of replacing: accepted only while the file's size is exactly `offset`. */
  appendAt?: number;
  signal?: AbortSignal;
}

export interface DownloadOptions {
  /** A window of the file: from `offset`, at most `length` bytes (default and max 8 MiB). */
  offset?: number;
  length?: number;
  signal?: AbortSignal;
}

export interface Download {
  /** The bytes; read it to the end or cancel it, or its connection stays busy. */
  body: ReadableStream<Uint8Array>;
  /** The file's whole size, on windowed reads (`X-Svc-File-Size`); else the length sent, when known. */
  size: number | null;
  /** Windowed reads: whether this window reaches the end of the file (`X-Svc-Eof`). */
  eof: boolean | null;
}

const encoder = new TextEncoder();

function isAsyncIterable(value: unknown): value is AsyncIterable<Uint8Array | string> {
  return typeof value === 'object' && value !== null && Symbol.asyncIterator in value;
}

/** Chunks of an async iterable as a web stream, pulled only as fast as the upload sends them. */
export function iterableToStream(source: AsyncIterable<Uint8Array | string>): ReadableStream<Uint8Array> {
  const iterator = source[Symbol.asyncIterator]();
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      const next = await iterator.next();
      if (next.done) return controller.close();
      controller.enqueue(typeof next.value === 'string' ? encoder.encode(next.value) : next.value);
    },
    async cancel(reason) {
      await iterator.return?.(reason);
    },
  });
}

/** The body as fetch takes it, and whether it can be sent only once. */
function requestBody(body: UploadBody): { body: NonNullable<RequestInit['body']>; oneShot: boolean } {
  if (body instanceof ReadableStream) return { body, oneShot: true };
  if (typeof body === 'string' || body instanceof Uint8Array || body instanceof ArrayBuffer || body instanceof Blob) return { body: body as NonNullable<RequestInit['body']>, oneShot: false };
  if (isAsyncIterable(body)) return { body: iterableToStream(body), oneShot: true };
  throw new TypeError('upload body must be bytes, a string, a Blob, a ReadableStream or an async iterable of chunks');
}

/** The bytes of a body that can be read again (a stream is sent once and never repeated): null for a stream. */
async function bytesOf(body: UploadBody): Promise<Uint8Array | null> {
  if (typeof body === 'string') return encoder.encode(body);
  if (body instanceof Uint8Array) return body;
  if (body instanceof ArrayBuffer) return new Uint8Array(body);
  if (body instanceof Blob) return new Uint8Array(await body.arrayBuffer());
  return null;
}

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && a.every((byte, i) => byte === b[i]);
}

export class Files {
  constructor(private readonly api: Client<paths>) {}

  /**
   * Writes `body` to `path` (replacing the file, or appending at `appendAt`). An append repeated
   * after its first attempt was cut off, and refused because the file already grew by exactly
   * its bytes, is checked: if those bytes are at its offset, the first attempt wrote them and the
   * call succeeded.
   */
  async upload(desktopId: string, path: string, body: UploadBody, options: UploadOptions = {}): Promise<void> {
    try {
      await this.put(desktopId, path, body, options);
    } catch (err) {
      if (!(err instanceof ConflictProblem && err.afterUnknownOutcome && options.appendAt !== undefined)) throw err;
      const mine = await bytesOf(body);
      if (mine === null || err.body.currentSize !== options.appendAt + mine.length) throw err;
      const there = await this.readBytes(desktopId, path, { offset: options.appendAt, length: mine.length, signal: options.signal });
      if (!sameBytes(there, mine)) throw err;
    }
  }

  private async put(desktopId: string, path: string, body: UploadBody, options: UploadOptions): Promise<void> {
    const sent = requestBody(body);
    await this.api.PUT('/v1/desktops/{id}/files/{path}', {
      params: {
        path: { id: desktopId, path },
        query: options.appendAt === undefined ? {} : { append: 'true', offset: String(options.appendAt) },
      },
      body: sent.body as unknown as string,
      bodySerializer: (raw: unknown) => raw,
      headers: { 'content-type': 'application/octet-stream', ...(sent.oneShot ? { [ONE_SHOT_BODY]: '1' } : {}) },
      // Node's fetch sends a stream body only when told the request may be half-duplex.
      ...({ duplex: 'half' } as object),
      signal: options.signal,
    });
  }

  /** The file (or a window of it) as a stream. */
  async download(desktopId: string, path: string, options: DownloadOptions = {}): Promise<Download> {
    const query: { offset?: string; length?: string } = {};
    if (options.offset !== undefined) query.offset = String(options.offset);
    if (options.length !== undefined) query.length = String(options.length);
    const { data, response } = await this.api.GET('/v1/desktops/{id}/files/{path}', {
      params: { path: { id: desktopId, path }, query },
      parseAs: 'stream',
      signal: options.signal,
    });
    const size = response.headers.get('x-svc-file-size') ?? response.headers.get('content-length');
    const eof = response.headers.get('x-svc-eof');
    return {
      // An empty file's answer may come without a body at all.
      body: (data as ReadableStream<Uint8Array> | null | undefined) ?? new ReadableStream({ start: (c) => c.close() }),
      size: size === null ? null : Number(size),
      eof: eof === null ? null : eof === 'true',
    };
  }

  /** The whole file in memory; for files you know are small (at most 8 MiB are served whole). */
  async readBytes(desktopId: string, path: string, options: DownloadOptions = {}): Promise<Uint8Array> {
    const { body } = await this.download(desktopId, path, options);
    return new Uint8Array(await new Response(body).arrayBuffer());
  }

  async stat(desktopId: string, path: string, signal?: AbortSignal): Promise<FileStat> {
    const { data } = await this.api.GET('/v1/desktops/{id}/files-meta/{path}', { params: { path: { id: desktopId, path } }, signal });
    return data!;
  }

  /** The direct children of a directory; `''` or `'/'` lists the guest's root. */
  async list(desktopId: string, path: string, signal?: AbortSignal): Promise<DirListing> {
    const { data } = await this.api.GET('/v1/desktops/{id}/dir/{path}', { params: { path: { id: desktopId, path } }, signal });
    return data!;
  }

  /** Deletes `path`. Repeated after its first attempt was cut off, a 404 means that attempt deleted it. */
  async remove(desktopId: string, path: string, options: { recursive?: boolean; signal?: AbortSignal } = {}): Promise<void> {
    try {
      await this.api.DELETE('/v1/desktops/{id}/files/{path}', {
        params: { path: { id: desktopId, path }, query: options.recursive ? { recursive: 'true' } : {} },
        signal: options.signal,
      });
    } catch (err) {
      if (!(err instanceof NotFoundProblem && err.afterUnknownOutcome)) throw err;
    }
  }
}
