/**
 * Sending a unit's stream to a receiver on the hot path of a move: every byte hashed, those from
 * the offset asked for written on, with backpressure (source.ts, precopy-source.ts).
 */
import { createHash } from 'node:crypto';
import type { Writable } from 'node:stream';
import type { UnitStream } from '../runtime/transfer.js';

/**
 * Hashes every byte of the stream and writes those from `offset` on into `out`. 'data' events
 * and a pause on a full `out`, rather than a chain of streams: this is the hot path of a move.
 * With `length`, a stream of any other length fails (a raw stream has no framing to say so).
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
    body.on('data', (chunk: Buffer) => {
      seen += chunk.length;
      if (length !== undefined && seen > length) return fail(new Error(`the unit stream is longer than its ${length} bytes`));
      hash.update(chunk);
      let piece = chunk;
      if (skip > 0) {
        if (skip >= chunk.length) {
          skip -= chunk.length;
          return;
        }
        piece = chunk.subarray(skip);
        skip = 0;
      }
      if (!out.write(piece)) {
        body.pause();
        out.once('drain', () => body.resume());
      }
    });
    body.once('end', () => {
      stream.done.then(() => {
        if (settled) return;
        if (length !== undefined && seen !== length) return fail(new Error(`the unit stream ended at ${seen} of ${length} bytes`));
        settled = true;
        resolve(hash.digest('hex'));
      }, fail);
    });
    body.once('error', fail);
    body.once('close', () => {
      if (!body.readableEnded) fail(new Error('the unit stream was cut'));
    });
    out.once('close', () => fail(new Error('the receiver went away')));
  });
}
