/**
 * Retrying a request the server asked us to repeat later. A 503 (a desktop moving between hosts,
 * a host unreachable, a replica not serving) and a 429 say "not now", usually with
 * `Retry-After`; the SDK waits what the header says (or backs off exponentially with jitter when
 * it says nothing, docs/api.md §7) and tries again, a bounded number of times.
 *
 * Only requests that are safe to repeat are repeated: methods HTTP calls idempotent (GET, HEAD,
 * PUT, DELETE, OPTIONS) and a POST carrying an `Idempotency-Key` to a route that keeps one
 * (create, wake, hibernate, destroy, fork: docs/api.md §4.11), which the server answers with the
 * first result when repeated. Any other POST (an exec, a screenshot, even one a caller put a key
 * on) is never sent twice behind the caller's back. A body that cannot be read twice (a stream
 * being uploaded) is never retried either: the caller sees the 503 and decides.
 *
 * An attempt cut off after it was sent (a reset, a timeout) may have been acted on: its answer
 * was lost, not its effect. The answer to the attempt after it is marked (`afterUnknownOutcome`),
 * so that a repeat refused because the first one worked (an append whose offset has moved on by
 * exactly its own bytes, a delete of what is gone) can be told from a real refusal (files.ts).
 *
 * This is a `fetch` wrapper, so it sits under openapi-fetch and every typed call gets it.
 */
import { CantoConnectionError, parseRetryAfterSecs } from './problem.js';

export type FetchLike = (input: Request) => Promise<Response>;

export interface RetryOptions {
  /** Attempts in all, the first included. Default 5; 1 turns retrying off. */
  maxAttempts?: number;
  /** First backoff when the server gives no Retry-After, in ms; doubles each attempt. Default 250. */
  baseDelayMs?: number;
  /** Longest backoff the SDK chooses itself, in ms. Default 8000. */
  maxDelayMs?: number;
  /**
   * Longest Retry-After honoured, in ms. A server asking for more is answered by giving up
   * (the caller gets the 503/429) rather than by retrying sooner than it asked. Default 60000.
   */
  maxRetryAfterMs?: number;
  /** Statuses retried. Default [429, 503]. */
  statuses?: readonly number[];
  /** Retry a request that failed to connect (refused, reset). Default true. */
  onConnectionError?: boolean;
  /** How to wait; replaceable so tests can observe the delays instead of sleeping them. */
  sleep?: (ms: number, signal: AbortSignal) => Promise<void>;
}

const IDEMPOTENT_METHODS = new Set(['GET', 'HEAD', 'PUT', 'DELETE', 'OPTIONS']);
/** The POST routes whose Idempotency-Key the server keeps. */
const KEYED_POSTS = /\/v1\/desktops(\/[^/]+\/(wake|hibernate|destroy|fork))?$/;

/** Answers that follow an attempt whose outcome is unknown (see above). */
const afterUnknown = new WeakSet<Response>();

/** Whether an attempt before this answer was cut off after it may have reached the server. */
export function answersAfterUnknownOutcome(response: Response): boolean {
  return afterUnknown.has(response);
}

/** A failed attempt that never reached the server: nothing was acted on. */
function neverSent(err: unknown): boolean {
  const code = (err as { cause?: { code?: unknown } } | null)?.cause?.code;
  return code === 'ECONNREFUSED' || code === 'ENOTFOUND' || code === 'EAI_AGAIN';
}

/** Marks a request whose body is a one-shot stream: never replayed. */
export const ONE_SHOT_BODY = 'x-canto-sdk-one-shot';

/** Whether `request` may be sent again after a 503/429 or a failed connection. */
export function isRetrySafe(request: Request): boolean {
  if (request.headers.has(ONE_SHOT_BODY)) return false;
  if (IDEMPOTENT_METHODS.has(request.method)) return true;
  return request.method === 'POST' && request.headers.has('idempotency-key') && KEYED_POSTS.test(new URL(request.url).pathname);
}

export function abortableSleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal.reason);
    };
    signal.addEventListener('abort', onAbort, { once: true });
  });
}

/**
 * The delay before attempt `attempt + 1` (attempt counts from 1), or null to give up: the
 * server's Retry-After when present and within the cap, else capped exponential backoff with
 * jitter (half to all of the step, so many clients refused at once do not return at once).
 */
export function retryDelayMs(attempt: number, retryAfter: string | null, options: RetryOptions = {}, random = Math.random): number | null {
  const secs = parseRetryAfterSecs(retryAfter);
  if (secs !== null) {
    const ms = Math.ceil(secs * 1000);
    return ms > (options.maxRetryAfterMs ?? 60_000) ? null : ms;
  }
  const step = Math.min(options.maxDelayMs ?? 8_000, (options.baseDelayMs ?? 250) * 2 ** (attempt - 1));
  return Math.round(step / 2 + (random() * step) / 2);
}

/**
 * `inner` with retries as described above, and each attempt bounded by `timeoutMs` when given.
 * Connection failures come out as `CantoConnectionError`.
 */
export function retryingFetch(inner: FetchLike, options: RetryOptions = {}, timeoutMs?: number): FetchLike {
  const maxAttempts = Math.max(1, options.maxAttempts ?? 5);
  const statuses = new Set(options.statuses ?? [429, 503]);
  const sleep = options.sleep ?? abortableSleep;
  return async (request) => {
    const safe = isRetrySafe(request);
    const oneShot = request.headers.has(ONE_SHOT_BODY);
    let unknownOutcome = false;
    for (let attempt = 1; ; attempt++) {
      const last = !safe || attempt >= maxAttempts;
      // A Request's body can be read once: each attempt but the last sends a copy.
      let attemptRequest = last ? request : request.clone();
      if (oneShot) {
        const headers = new Headers(attemptRequest.headers);
        headers.delete(ONE_SHOT_BODY);
        attemptRequest = new Request(attemptRequest, { headers, duplex: 'half' } as RequestInit);
      }
      if (timeoutMs !== undefined) {
        const signal = AbortSignal.any([request.signal, AbortSignal.timeout(timeoutMs)]);
        attemptRequest = new Request(attemptRequest, { signal, duplex: 'half' } as RequestInit);
      }
      let response: Response;
      try {
        response = await inner(attemptRequest);
      } catch (err) {
        // The caller's own abort ends the call; anything else is the network's doing.
        if (request.signal.aborted) throw err;
        if (last || options.onConnectionError === false) throw new CantoConnectionError(new URL(request.url).origin, err);
        if (!neverSent(err)) unknownOutcome = true;
        const delay = retryDelayMs(attempt, null, options);
        await sleep(delay!, request.signal);
        continue;
      }
      if (unknownOutcome) afterUnknown.add(response);
      if (last || !statuses.has(response.status)) return response;
      const delay = retryDelayMs(attempt, response.headers.get('retry-after'), options);
      if (delay === null) return response;
      // Nobody reads this answer: free its connection before waiting.
      await response.body?.cancel().catch(() => undefined);
      await sleep(delay, request.signal);
    }
  };
}
