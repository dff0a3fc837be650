/**
 * What every Canto client shares under its typed calls: openapi-fetch bound to a base URL and a
 * bearer credential, the retrying fetch (retry.ts) beneath it, guest paths put into URLs segment
 * by segment, and every answer of 400 and up thrown as a `CantoProblem` (problem.ts). Because the
 * problem is thrown from openapi-fetch's response hook, the raw typed client (`canto.api.GET…`)
 * throws exactly like the helpers do: a call that returns, succeeded.
 */
import createClient, { type Client, type Middleware } from 'openapi-fetch';
import { toProblem } from './problem.js';
import { answersAfterUnknownOutcome, retryingFetch, type FetchLike, type RetryOptions } from './retry.js';

export interface TransportOptions {
  /** Where the API is served, e.g. `https://canto.example.com` (no `/v1`). */
  baseUrl: string;
  /** Sent as `Authorization: Bearer …`. */
  token: string;
  /** A fetch of your own (a proxy agent, a test double); default the global fetch. */
  fetch?: FetchLike;
  /** Retrying of 503/429 and failed connections; `false` turns it off. */
  retry?: RetryOptions | false;
  /** Limit on each attempt of each request, in ms. Default: none. */
  timeoutMs?: number;
}

/**
 * Guest paths (`{path}`, docs/api.md §4.4) keep their slashes: each segment is percent-encoded on its
 * own, and a leading `/` is dropped so `/root/a.txt` and `root/a.txt` name the same file.
 *
 * A `.` or `..` segment (or an id that is one) is refused here, before anything is sent: URL
 * parsing removes such segments (percent-encoded ones too) before the request leaves, so
 * `files.remove(id, '../../../keys/key_…')` went out as `DELETE /v1/keys/key_…` and revoked a key,
 * and the server, which answers 400 to a `..` in a guest path, never saw it.
 */
export function serializePath(url: string, params: Record<string, unknown>): string {
  return url.replace(/\{([^{}]+)\}/g, (whole, name: string) => {
    const value = params[name];
    if (value === undefined || value === null) return whole;
    const segments = name === 'path' ? String(value).replace(/^\/+/, '').split('/') : [String(value)];
    if (segments.some((s) => s === '.' || s === '..')) {
      throw new TypeError(`${name} ${JSON.stringify(String(value))} has a "." or ".." segment, which would name another URL; nothing was sent`);
    }
    return segments.map(encodeURIComponent).join('/');
  });
}

const throwProblems: Middleware = {
  async onResponse({ request, response }) {
    if (response.ok) return undefined;
    const text = await response.text();
    let body: unknown = text;
    try {
      body = JSON.parse(text);
    } catch {
      // Not JSON (a proxy's page): its text becomes the detail.
    }
    const problem = toProblem(response, body, request.method);
    if (answersAfterUnknownOutcome(response)) problem.afterUnknownOutcome = true;
    throw problem;
  },
};

export function createTransport<Paths extends object>(options: TransportOptions): Client<Paths> {
  const base: FetchLike = options.fetch ?? ((request) => globalThis.fetch(request));
  const client = createClient<Paths>({
    baseUrl: options.baseUrl.replace(/\/+$/, ''),
    headers: { authorization: `Bearer ${options.token}` },
    fetch: retryingFetch(base, options.retry === false ? { maxAttempts: 1 } : options.retry, options.timeoutMs),
    pathSerializer: serializePath,
  });
  client.use(throwProblems);
  return client;
}

/**
 * The data of a typed call whose problems were already thrown: narrows away openapi-fetch's
 * error branch, so `unwrap(await canto.api.GET(…))` is the answer's type.
 */
export function unwrap<R extends { data?: unknown; response: Response }>(result: R): NonNullable<R['data']> {
  return result.data as NonNullable<R['data']>;
}
