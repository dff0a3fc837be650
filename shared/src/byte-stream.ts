/**
 * Byte streams that ride the agent link beside a request: an upload (requester → handler, e.g. a
 * file body) or a download (handler → requester, e.g. a file read). The bytes travel as
 * `stream.up` / `stream.down` notifications keyed by the request's id, in order, between the
 * request frame and its reply (upload) or after the reply (download), so a file never has to sit
 * whole in a frame.
 *
 * `IncomingBytes` is the receiving end: a queue that turns pushed chunks into an async iterable.
 * It ends with `end()`, fails with `fail()` (the sender aborted, or the link closed), and tells
 * its hooks what the consumer took, which is how a flow-controlled sender (rpc.ts) learns it may
 * send more.
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

/** What the receiving side of a flow-controlled stream tells its sender (rpc.ts). */
export interface IncomingHooks {
  /** The consumer took `bytes` more. */
  consumed?(bytes: number): void;
  /** The consumer stopped reading before the end (it returned early). */
  abandoned?(): void;
}

export class IncomingBytes implements AsyncIterable<Buffer> {
  private readonly chunks: Buffer[] = [];
  private done = false;
  private error: Error | null = null;
  private wake: (() => void) | null = null;

  constructor(private readonly hooks: IncomingHooks = {}) {}

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
    let finished = false;
    try {
      for (;;) {
        if (this.error) {
          finished = true;
          throw this.error;
        }
        const chunk = this.chunks.shift();
        if (chunk !== undefined) {
          this.hooks.consumed?.(chunk.length);
          yield chunk;
          continue;
        }
        if (this.done) {
          finished = true;
          return;
        }
        await new Promise<void>((resolve) => (this.wake = resolve));
      }
    } finally {
      if (!finished) this.hooks.abandoned?.();
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
