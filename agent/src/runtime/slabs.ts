/**
 * Bulk bytes in buffers that are used again, for the hot path of a move.
 *
 * Node hands every socket read over in a buffer of its own. At a move's rate (hundreds of MB a
 * second) those buffers are what V8's collector spends its time on: an agent sending or
 * receiving a unit ran a full mark-compact every 60-80 ms, its marking threads taking a third
 * of both cores. A socket made with `onread` reads into one buffer instead; the bytes are copied
 * from it into slabs of 1 MiB, each handed to a taker with what hands it back, and a slab handed
 * back is filled again. A taker hands a slab back once whatever it wrote the bytes to is done
 * with them (a socket's, a file's or a pipe's write callback), never before.
 *
 * `SlabQueue` is the copying and handing over; `SlabReader` reads a child's stdout that way
 * (spawner.ts `stdoutOnread`); transfer/raw-unit.ts reads a network stream that way.
 */
import type { Readable } from 'node:stream';

/** The unit of hand-over and of reuse. */
export const SLAB_BYTES = 1 << 20;
/** What one socket read may bring. */
export const READ_BYTES = 256 << 10;

/**
 * Takes a chunk (valid until `release` is called) and what hands its buffer back; answers a
 * promise only when the next chunk must wait for it. A throw or a rejection fails the reading.
 */
export type SlabTaker = (chunk: Buffer, release: () => void) => Promise<void> | null;

/** The `onread` option of a socket that reads into one buffer. */
export interface OnRead {
  readonly buffer: Buffer;
  readonly callback: (n: number, buf: Uint8Array) => boolean;
}

export class SlabQueue {
  private slab: Buffer | null = null;
  private used = 0;
  private readonly free: Buffer[] = [];
  /** Chunks handed over and not yet taken, in order. */
  private readonly ready: Array<{ chunk: Buffer; release: () => void }> = [];
  private taker: SlabTaker | null = null;
  private waiting = false;
  private broken = false;

  /**
   * `idle`: everything handed over has been taken, so reading may go on (told after each pump
   * that ends so); `failed`: the taker threw or rejected.
   */
  constructor(private readonly events: { idle(): void; failed(err: Error): void }) {}

  /** Whether reading may go on: a taker is there and has taken all it was handed. */
  get idle(): boolean {
    return this.taker !== null && !this.waiting && this.ready.length === 0 && !this.broken;
  }

  /** Starts handing chunks to `taker`. */
  take(taker: SlabTaker): void {
    if (this.taker !== null) throw new Error('the bytes are already being taken');
    this.taker = taker;
    this.pump();
  }

  /** Copies `buf[from, to)` in, handing over each slab it fills; `left`: bytes still to come in all, when known. */
  copy(buf: Buffer, from: number, to: number, left = Number.POSITIVE_INFINITY): void {
    let at = from;
    let rest = left;
    while (at < to) {
      this.slab ??= this.free.pop() ?? Buffer.allocUnsafeSlow(Math.min(SLAB_BYTES, rest));
      const k = Math.min(to - at, this.slab.length - this.used);
      buf.copy(this.slab, this.used, at, at + k);
      this.used += k;
      at += k;
      rest -= k;
      if (this.used === this.slab.length) this.seal();
    }
  }

  /** Hands over what the slab being filled holds (at the end, or at a break: what came is good). */
  seal(): void {
    const slab = this.slab;
    if (slab === null || this.used === 0) return;
    const chunk = slab.subarray(0, this.used);
    this.slab = null;
    this.used = 0;
    let released = false;
    // A full-size slab comes back for reuse; a smaller last one is left to the collector.
    const release = () => {
      if (released || slab.length !== SLAB_BYTES) return;
      released = true;
      this.free.push(slab);
    };
    this.ready.push({ chunk, release });
  }

  /** Hands queued chunks to the taker while it takes them at once. */
  pump(): void {
    const take = this.taker;
    if (take === null || this.broken) return;
    while (!this.waiting && this.ready.length > 0) {
      const { chunk, release } = this.ready.shift()!;
      let pending: Promise<void> | null;
      try {
        pending = take(chunk, release);
      } catch (err) {
        this.break(err);
        return;
      }
      if (pending !== null) {
        this.waiting = true;
        pending.then(
          () => {
            this.waiting = false;
            this.pump();
          },
          (err: unknown) => this.break(err),
        );
      }
    }
    if (this.idle) this.events.idle();
  }

  private break(err: unknown): void {
    this.broken = true;
    this.events.failed(err instanceof Error ? err : new Error(String(err)));
  }
}

/**
 * A child's stdout read into slabs: pass `onread` as the spawn's `stdoutOnread`, then `read`
 * the child's stdout socket. Resolves once its end came and every chunk has been taken; rejects
 * when the taker fails or the socket closes before its end. Destroying the socket stops it.
 */
export class SlabReader {
  readonly onread: OnRead = { buffer: Buffer.allocUnsafeSlow(READ_BYTES), callback: (n, buf) => this.onRead(n, buf as Buffer) };
  private readonly queue = new SlabQueue({ idle: () => this.idle(), failed: (err) => this.settle(err) });
  private socket: Readable | null = null;
  private ended = false;
  private settled: { resolve: () => void; reject: (err: Error) => void } | null = null;

  read(socket: Readable, take: SlabTaker): Promise<void> {
    if (this.socket !== null) return Promise.reject(new Error('the stream is already being read'));
    this.socket = socket;
    const reading = new Promise<void>((resolve, reject) => (this.settled = { resolve, reject }));
    socket.once('end', () => {
      this.ended = true;
      this.queue.seal();
      this.queue.pump();
    });
    socket.once('error', (err) => this.settle(err));
    socket.once('close', () => {
      if (!this.ended) this.settle(new Error('the stream was cut'));
    });
    this.queue.take(take);
    return reading;
  }

  private onRead(n: number, buf: Buffer): boolean {
    this.queue.copy(buf, 0, n);
    this.queue.pump();
    // Paused while a chunk waits to be taken; idle() resumes.
    return this.queue.idle;
  }

  private idle(): void {
    if (this.ended) this.settle(null);
    else this.socket?.resume();
  }

  private settle(err: Error | null): void {
    const settled = this.settled;
    if (settled === null) return;
    this.settled = null;
    if (err === null) settled.resolve();
    else {
      this.socket?.destroy();
      settled.reject(err);
    }
  }
}
