/**
 * One delivery attempt: a single HTTP POST of the stored body over a guarded connection, bounded
 * by one deadline that covers resolving, connecting, the TLS handshake and the response headers.
 *
 * Only the status matters: the response body is drained (at most 64 KiB, briefly) and dropped.
 * Redirects are never followed, because a 3xx would send the signed payload to a URL the client
 * never registered and the guard never saw; a 3xx counts as a failed attempt. Each attempt uses
 * its own connection (`Connection: close`), so the address check is never skipped by reusing a
 * pooled socket.
 *
 * What an attempt reports is a fixed sentence per kind of failure: it ends up in the delivery
 * log, which API clients read, so it never carries resolver answers, local addresses or stack
 * text.
 */
import { request as httpRequest } from 'node:http';
import type { Socket } from 'node:net';
import { connectGuarded, RefusedAddress, type ConnectPolicy } from './guarded-connect.js';

export const USER_AGENT = 'Canto-Webhooks/1.0';
const DRAIN_BYTES = 64 * 1024;
const DRAIN_MS = 1_000;

export interface DeliveryRequest {
  readonly url: string;
  readonly body: string;
  /** The Svc-* headers; content headers are added here. */
  readonly headers: Readonly<Record<string, string>>;
}

export type AttemptResult =
  | { kind: 'response'; status: number }
  | { kind: 'error'; message: string; permanent: boolean }
  /** The dispatcher is stopping: nothing is known about this attempt. */
  | { kind: 'aborted' };

class AttemptTimeout extends Error {}

export interface AttemptOptions {
  readonly policy: ConnectPolicy;
  readonly timeoutMs: number;
  /** Aborts the attempt when the dispatcher stops. */
  readonly signal?: AbortSignal;
}

export async function postDelivery(req: DeliveryRequest, options: AttemptOptions): Promise<AttemptResult> {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(new AttemptTimeout()), options.timeoutMs);
  const stop = () => controller.abort(options.signal?.reason);
  options.signal?.addEventListener('abort', stop, { once: true });
  try {
    if (options.signal?.aborted) return { kind: 'aborted' };
    const url = new URL(req.url);
    // An http endpoint registered while the deployment allowed it stays refused once it does not.
    if (url.protocol !== 'https:' && !options.policy.allowLoopback) {
      return { kind: 'error', message: 'refused: plain http is not allowed on this deployment', permanent: true };
    }
    const socket = await connectGuarded(url, options.policy, controller.signal);
    return { kind: 'response', status: await exchange(socket, url, req, controller.signal) };
  } catch (err) {
    if (options.signal?.aborted) return { kind: 'aborted' };
    return describeFailure(err, options.timeoutMs);
  } finally {
    clearTimeout(timer);
    options.signal?.removeEventListener('abort', stop);
  }
}

function exchange(socket: Socket, url: URL, req: DeliveryRequest, signal: AbortSignal): Promise<number> {
  return new Promise<number>((resolve, reject) => {
    const body = Buffer.from(req.body, 'utf8');
    const request = httpRequest({
      method: 'POST',
      path: `${url.pathname}${url.search}`,
      setHost: false,
      headers: {
        host: url.host,
        'user-agent': USER_AGENT,
        'content-type': 'application/json',
        'content-length': String(body.length),
        connection: 'close',
        ...req.headers,
      },
      createConnection: () => socket,
    });
    const onAbort = () => request.destroy(signal.reason as Error);
    signal.addEventListener('abort', onAbort, { once: true });
    request.on('error', (err) => {
      signal.removeEventListener('abort', onAbort);
      reject(err);
    });
    request.on('response', (res) => {
      signal.removeEventListener('abort', onAbort);
      resolve(res.statusCode ?? 0);
      const drain = setTimeout(() => socket.destroy(), DRAIN_MS);
      let read = 0;
      res.on('data', (chunk: Buffer) => {
        read += chunk.length;
        if (read > DRAIN_BYTES) socket.destroy();
      });
      res.on('error', () => {});
      res.on('close', () => {
        clearTimeout(drain);
        socket.destroy();
      });
    });
    request.end(body);
  });
}

const TLS_CERT_CODES = /^(CERT_|UNABLE_TO_|DEPTH_ZERO_|SELF_SIGNED_|ERR_TLS_CERT_|HOSTNAME_MISMATCH)/;

/** The delivery-log sentence for a failed attempt, and whether retrying could help. */
export function describeFailure(err: unknown, timeoutMs: number): AttemptResult {
  if (err instanceof RefusedAddress) return { kind: 'error', message: `refused: ${err.message}`, permanent: true };
  if (err instanceof AttemptTimeout) return { kind: 'error', message: `no response within ${timeoutMs} ms`, permanent: false };
  const code = String((err as { code?: unknown } | null)?.code ?? '');
  const message = ((): string => {
    if (code === 'ENOTFOUND' || code === 'EAI_AGAIN' || code === 'EAI_NONAME' || code === 'EAI_NODATA') return 'the host name did not resolve';
    if (code === 'ECONNREFUSED') return 'connection refused';
    if (code === 'ECONNRESET' || code === 'EPIPE' || code === 'ECONNABORTED') return 'connection closed before a response';
    if (code === 'EHOSTUNREACH' || code === 'ENETUNREACH' || code === 'ETIMEDOUT') return 'host unreachable';
    if (TLS_CERT_CODES.test(code)) return `TLS certificate not accepted (${code})`;
    if (code === 'EPROTO' || code.startsWith('ERR_SSL_')) return 'TLS handshake failed';
    if (code.startsWith('HPE_')) return 'invalid HTTP response';
    return 'connection failed';
  })();
  return { kind: 'error', message, permanent: false };
}

/** The delivery-log sentence for a non-2xx answer. */
export function describeStatus(status: number): string {
  if (status >= 300 && status < 400) return `HTTP ${status}: redirects are not followed`;
  return `HTTP ${status}`;
}
