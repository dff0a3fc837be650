/**
 * The importer's HTTP client for another agent's transfer server (server.ts). It sorts what can
 * go wrong into what a new request may cure (the connection broke or stalled, the source answered
 * 5xx), which the importer retries, and what it cannot, which become the import's AgentFailure at
 * once. Of those, a ticket the source says it does not hold (401, TICKET_UNKNOWN) is retryable
 * for the scheduler, not here: the source no longer knows it (its agent restarted, which forgets every ticket, or the desktop was started or
 * destroyed there since), so the same ticket would be refused again, but the scheduler's next try
 * of the copy asks the source for a new export (scheduler/src/engine/move.ts `copy`). A missing
 * or changed desktop is not retryable. Nothing here logs the ticket.
 */
import { request, type IncomingMessage } from 'node:http';
import { AgentFailure } from '../../../shared/src/protocol.js';
import { TICKET_UNKNOWN } from './tickets.js';

/** A failure a new request may get past: the importer retries it, resuming where it was. */
export class TransientFetchError extends Error {
  override readonly name = 'TransientFetchError';
}

export interface GetOptions {
  readonly ticket: string;
  /** A response that sends nothing for this long is given up (and retried). */
  readonly idleTimeoutMs: number;
  readonly signal?: AbortSignal;
}

/**
 * GETs `url`; resolves with a 200 response, whose body the caller reads. `onSent` is told once
 * the request has gone out (a caller may then do its own work while the source prepares).
 */
export function get(url: string, options: GetOptions, onSent?: () => void): Promise<IncomingMessage> {
  return new Promise((resolve, reject) => {
    let parsed: URL;
    try {
      parsed = httpUrl(url);
    } catch (err) {
      reject(err);
      return;
    }
    const req = request(parsed, {
      method: 'GET',
      // A connection per request: a unit's stream is long, and a broken one must not be reused.
      agent: false,
      headers: { authorization: `Bearer ${options.ticket}` },
      signal: options.signal,
    });
    req.setTimeout(options.idleTimeoutMs, () => req.destroy(new TransientFetchError(`no bytes from the source for ${options.idleTimeoutMs} ms`)));
    req.once('error', (err) => reject(classify(err, options.signal)));
    if (onSent !== undefined) req.once('finish', onSent);
    req.once('response', (res) => {
      if (res.statusCode === 200) {
        resolve(res);
        return;
      }
      void refusal(res).then(reject);
    });
    req.end();
  });
}

/** The source's URL, which must be http; an AgentFailure otherwise. */
export function httpUrl(url: string): URL {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new AgentFailure('bad_request', 'the source URL is not a URL', false);
  }
  if (parsed.protocol !== 'http:') throw new AgentFailure('bad_request', 'the source URL must be http', false);
  return parsed;
}

/** GETs a JSON answer. */
export async function getJson(url: string, options: GetOptions): Promise<unknown> {
  const res = await get(url, options);
  const parts: Buffer[] = [];
  try {
    for await (const chunk of res as AsyncIterable<Buffer>) parts.push(chunk);
  } catch (err) {
    throw classify(err, options.signal);
  }
  try {
    return JSON.parse(Buffer.concat(parts).toString('utf8'));
  } catch {
    throw new TransientFetchError('the source answered something that is not JSON');
  }
}

/** What a body-read error or request error is, for the importer. */
export function classify(err: unknown, signal?: AbortSignal): Error {
  if (signal?.aborted) return new AgentFailure('runtime_error', 'the import was cancelled', false);
  if (err instanceof AgentFailure || err instanceof TransientFetchError) return err;
  return new TransientFetchError(err instanceof Error ? err.message : String(err));
}

/** Reads a refusal's problem body (small) and turns its status into the import's failure. */
async function refusal(res: IncomingMessage): Promise<Error> {
  let text = '';
  try {
    for await (const chunk of res as AsyncIterable<Buffer>) {
      if (text.length < 2000) text += chunk.toString('utf8');
    }
  } catch {
    // The detail is a nicety; the status says enough.
  }
  return refusalFor(res.statusCode ?? 0, text);
}

/** The import's failure for a refusal with this status and (problem) body. */
export function refusalFor(status: number, text: string): Error {
  let detail = `HTTP ${status}`;
  let unknownTicket = false;
  try {
    const problem = JSON.parse(text) as { detail?: unknown };
    if (typeof problem.detail === 'string') {
      detail = `${detail}: ${problem.detail.slice(0, 200)}`;
      unknownTicket = problem.detail === TICKET_UNKNOWN;
    }
  } catch {
    // not a problem body
  }
  // Only the source's own word that it does not hold the ticket is cured by a new export; any
  // other 401 (a ticket it found malformed, a proxy in the way) would come back at every try,
  // each with the desktop stopped, until the move's deadline.
  if (status === 401 && unknownTicket) {
    return new AgentFailure('unauthorized', `the source no longer knows the transfer ticket (it restarted, or the desktop was started or destroyed there since its export); the next try asks it for a new export (${detail})`, true);
  }
  if (status === 401) return new AgentFailure('unauthorized', `the source refused the transfer ticket (${detail})`, false);
  if (status === 404) return new AgentFailure('not_found', `the source does not have it (${detail})`, false);
  if (status === 409) return new AgentFailure('conflict', `the source cannot send the desktop now (${detail})`, false);
  if (status === 416) return new RangeRefused(detail);
  if (status >= 500 || status === 429) return new TransientFetchError(`the source failed (${detail})`);
  return new AgentFailure('runtime_error', `the source refused the request (${detail})`, false);
}

/** 416: the partial file is longer than the unit the source has now; it must start over. */
export class RangeRefused extends TransientFetchError {}
