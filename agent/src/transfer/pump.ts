/**
 * Sending a unit's stream to a receiver on the hot path of a move: every byte hashed, those from
 * the offset asked for written on, with backpressure (source.ts, precopy-source.ts).
 */
import { createHash } from 'node:crypto';
import type { Writable } from 'node:stream';
import type { UnitStream } from '../runtime/transfer.js';

/**
 * Hashes every byte of the stream and writes those from `offset` on into `out`, pausing while
 * `out` is full. A stream in slabs (runtime/slabs.ts) hands each slab back once `out` has
 * written it; any other is read with 'data' events rather than a chain of streams. With
 * `length`, a stream of any other length fails (a raw stream has no framing to say so).
 */
export function pump(stream: UnitStream, out: Writable, offset: number, length?: number): Promise<string> {
  const { body } = stream;
  const hash = createHash('sha256');
  let skip = offset;
  let seen = 0;
  return new Promise<string>((resolve, reject) => {
    let settled = false;
    const fail = (err: Error) => {
      if (settled) return;
      settled = true;
      body.destroy();
      reject(err);
    };
    /** Hashes a chunk; answers what of it is to be written (null: nothing, or the stream failed). */
    const hashed = (chunk: Buffer): Buffer | null => {
      seen += chunk.length;
      if (length !== undefined && seen > length) {
        fail(new Error(`the unit stream is longer than its ${length} bytes`));
        return null;
      }
      hash.update(chunk);
      if (skip >= chunk.length) {
        skip -= chunk.length;
        return null;
      }
      const piece = skip > 0 ? chunk.subarray(skip) : chunk;
      skip = 0;
      return piece;
    };
    const ended = () => {
      stream.done.then(() => {
        if (settled) return;
        if (length !== undefined && seen !== length) return fail(new Error(`the unit stream ended at ${seen} of ${length} bytes`));
        settled = true;
        resolve(hash.digest('hex'));
      }, fail);
    };
    if (stream.slabs !== undefined) {
      stream.slabs.read(body, (chunk, release) => {
        const piece = settled ? null : hashed(chunk);
        if (piece === null) {
          release();
          return null;
        }
        if (out.write(piece, () => release())) return null;
        return new Promise((resume) => out.once('drain', resume));
      }).then(ended, fail);
    } else {
      body.on('data', (chunk: Buffer) => {
        const piece = hashed(chunk);
        if (piece !== null && !out.write(piece)) {
          body.pause();
          out.once('drain', () => body.resume());
        }
      });
      body.once('end', ended);
    }
    body.once('error', fail);
    body.once('close', () => {
      if (!body.readableEnded) fail(new Error('the unit stream was cut'));
    });
    out.once('close', () => fail(new Error('the receiver went away')));
  });
}
