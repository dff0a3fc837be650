/**
 * Wake, hibernate, destroy and fork answer at once with an operation (docs/api.md §3.3); waiting for it to
 * settle is the client's job. The SDK polls `GET /v1/operations/{id}` (the admin API's moves
 * poll theirs the same way) starting fast and slowing to every two seconds, for as long as the
 * caller allows — unlike the server's `?wait=true`, which gives up after 120 s.
 */
import type { components } from './generated/api.js';
import { abortableSleep } from './retry.js';

export type Operation = components['schemas']['OperationJson'];

/** Any operation record: the public API's and the admin API's share these members. */
export interface OperationLike {
  id: string;
  state: 'pending' | 'running' | 'succeeded' | 'failed';
  error?: { code: string; message: string; [member: string]: unknown } | null;
}

export interface WaitOptions {
  /** Give up after this long, in ms; `Infinity` never gives up. Default 600000 (ten minutes). */
  timeoutMs?: number;
  /** Stops the wait (and its poll in flight). */
  signal?: AbortSignal;
  /** First pause between polls, in ms; it grows by half each poll up to `maxIntervalMs`. Default 200. */
  intervalMs?: number;
  /** Default 2000, the server's own poll cadence (docs/api.md §8). */
  maxIntervalMs?: number;
  /** Return a failed operation instead of throwing `OperationFailedError`. Default false. */
  allowFailure?: boolean;
}

/** An operation settled `failed`; `operation.error` says why. */
export class OperationFailedError<Op extends OperationLike = Operation> extends Error {
  override readonly name = 'OperationFailedError';
  constructor(readonly operation: Op) {
    super(`operation ${operation.id} failed: ${operation.error?.message ?? 'no reason given'}${operation.error?.code ? ` (${operation.error.code})` : ''}`);
  }
}

/** The operation did not settle within `timeoutMs`; `operation` is how it was last seen. */
export class OperationTimeoutError<Op extends OperationLike = Operation> extends Error {
  override readonly name = 'OperationTimeoutError';
  constructor(
    readonly operation: Op,
    timeoutMs: number,
  ) {
    super(`operation ${operation.id} still ${operation.state} after ${timeoutMs} ms`);
  }
}

export const isSettled = (op: OperationLike) => op.state === 'succeeded' || op.state === 'failed';

/** Polls `read` until the operation settles; resolves with it, or throws as `options` say. */
export async function pollOperation<Op extends OperationLike>(first: Op, read: (id: string, signal: AbortSignal) => Promise<Op>, options: WaitOptions = {}): Promise<Op> {
  const timeoutMs = options.timeoutMs ?? 600_000;
  const signals = [options.signal, Number.isFinite(timeoutMs) ? AbortSignal.timeout(timeoutMs) : undefined].filter((s): s is AbortSignal => s !== undefined);
  const signal = AbortSignal.any(signals);
  let op = first;
  let interval = options.intervalMs ?? 200;
  try {
    while (!isSettled(op)) {
      await abortableSleep(interval, signal);
      interval = Math.min(options.maxIntervalMs ?? 2000, Math.ceil(interval * 1.5));
      op = await read(op.id, signal);
    }
  } catch (err) {
    // Our own deadline, not the caller's abort nor a failed read: say what was last seen.
    if (signal.aborted && !options.signal?.aborted) throw new OperationTimeoutError(op, timeoutMs);
    throw err;
  }
  if (op.state === 'failed' && !options.allowFailure) throw new OperationFailedError(op);
  return op;
}
