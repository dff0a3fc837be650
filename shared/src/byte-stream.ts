/**
 * Byte streams that ride the agent link beside a request: an upload (requester → handler, e.g. a
 * file body) or a download (handler → requester, e.g. a file read). The bytes travel as
 * `stream.up` / `stream.down` notifications keyed by the request's id, in order, between the
 * request frame and its reply (upload) or after the reply (download), so a file never has to sit
 * whole in a frame.
 *
 * `IncomingBytes` is the receiving end: a queue that turns pushed chunks into an async iterable.
 * It ends with `end()`, fails with `fail()` (the sender aborted, or the link closed), and holds at
 * most what the sender sends: the API caps every transfer at one 8 MiB chunk, so there is no
 * flow control beyond that cap.
 */
import { Type, type Static } from '@sinclair/typebox';

export const StreamFrame = Type.Object({
  /** Id of the request the stream belongs to, in the requester's id space. */
  id: Type.Integer({ minimum: 1 }),
  data: Type.Optional(Type.Uint8Array()),
  end: Type.Optional(Type.Literal(true)),
  /** Set instead of `end` when the sender gives up; the receiver must discard what it got. */
  error: Type.Optional(Type.String()),
});
export type StreamFrame = Static<typeof StreamFrame>;

/** Chunks are regrouped to about this size before they are framed. */
export const STREAM_CHUNK_BYTES = 256 * 1024;

export class StreamAborted extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'StreamAborted';
  }
}

export class IncomingBytes implements AsyncIterable<Buffer> {
  private readonly chunks: Buffer[] = [];
  private done = false;
  private error: Error | null = null;
  private wake: (() => void) | null = null;

  push(chunk: Uint8Array): void {
    if (this.done || this.error) return;
    this.chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength));
    this.notify();
  }

  end(): void {
    this.done = true;
    this.notify();
  }

  fail(error: Error): void {
    if (this.done) return;
    this.error = error;
    this.chunks.length = 0;
    this.notify();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<Buffer> {
    for (;;) {
      if (this.error) throw this.error;
      const chunk = this.chunks.shift();
      if (chunk !== undefined) {
        yield chunk;
        continue;
      }
      if (this.done) return;
      await new Promise<void>((resolve) => (this.wake = resolve));
    }
  }

  private notify(): void {
    const wake = this.wake;
    this.wake = null;
    wake?.();
  }
}

/** Regroups a byte source into chunks of about `size` bytes (the last one may be smaller). */
export async function* rechunk(source: AsyncIterable<Uint8Array>, size = STREAM_CHUNK_BYTES): AsyncGenerator<Buffer> {
  let parts: Uint8Array[] = [];
  let held = 0;
  for await (const part of source) {
    if (part.byteLength === 0) continue;
    if (held === 0 && part.byteLength >= size) {
      yield Buffer.isBuffer(part) ? part : Buffer.from(part);
      continue;
    }
    parts.push(part);
    held += part.byteLength;
    if (held >= size) {
      yield Buffer.concat(parts, held);
      parts = [];
      held = 0;
    }
  }
  if (held > 0) yield Buffer.concat(parts, held);
}

/** A handler's result that is followed by a download stream. */
export class WithDownload {
  constructor(
    readonly result: unknown,
    readonly body: AsyncIterable<Uint8Array>,
  ) {}
}
