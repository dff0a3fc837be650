/**
 * Every answer of 400 and up from a Canto API is RFC 9457 problem+json; the SDK turns it into a
 * `CantoProblem` so callers catch one class and branch on `kind` (or on the subclass) instead of
 * on numbers. Another org's desktop answers exactly like a missing one, so both arrive as
 * `NotFoundProblem` with the same detail: the SDK adds nothing that could tell them apart.
 * A failure to reach the API at all is a `CantoConnectionError`, not a problem: there was no
 * answer to describe.
 */

/** The members docs/api.md §7 gives every problem, plus whatever extension members the answer had. */
export interface ProblemBody {
  type: string;
  title: string;
  status: number;
  detail: string;
  operation_id?: string;
  request_id?: string;
  currentSize?: number;
  errors?: Array<{ field: string; message: string }>;
  [member: string]: unknown;
}

export type ProblemKind =
  | 'bad_request'
  | 'unauthorized'
  | 'forbidden'
  | 'not_found'
  | 'conflict'
  | 'payload_too_large'
  | 'unsupported_media_type'
  | 'rate_limited'
  | 'internal'
  | 'not_implemented'
  | 'unavailable'
  | 'timeout'
  | 'other';

const KINDS: Record<number, ProblemKind> = {
  400: 'bad_request',
  401: 'unauthorized',
  403: 'forbidden',
  404: 'not_found',
  409: 'conflict',
  413: 'payload_too_large',
  415: 'unsupported_media_type',
  429: 'rate_limited',
  500: 'internal',
  501: 'not_implemented',
  503: 'unavailable',
  504: 'timeout',
};

export class CantoProblem extends Error {
  override readonly name: string = 'CantoProblem';
  /** The Idempotency-Key a keyed call (create, wake, hibernate, destroy, fork) was sent with. */
  idempotencyKey?: string;
  readonly kind: ProblemKind;
  readonly status: number;
  readonly type: string;
  readonly title: string;
  readonly detail: string;
  /** On a 500: the id the server logged the failure under; quote it when reporting. */
  readonly requestId: string | undefined;
  /** When the problem concerns an operation (a failed operation seen through `?wait=true`). */
  readonly operationId: string | undefined;
  /** The whole problem body, extension members included (`currentSize`, `errors`). */
  readonly body: ProblemBody;
  readonly method: string;
  /** The request's path and query, without the base URL. */
  readonly path: string;
  /** Seconds the server asked to wait before retrying (429, 503), when it said. */
  readonly retryAfterSecs: number | null;
  /**
   * An earlier attempt of this call was cut off after it may have reached the server (its answer
   * lost, not necessarily its effect): this answer may be about what that attempt did.
   */
  afterUnknownOutcome = false;

  constructor(body: ProblemBody, request: { method: string; path: string }, retryAfterSecs: number | null = null) {
    super(`${body.detail} (HTTP ${body.status} from ${request.method} ${request.path})`);
    this.status = body.status;
    this.kind = KINDS[body.status] ?? 'other';
    this.type = body.type;
    this.title = body.title;
    this.detail = body.detail;
    this.requestId = typeof body.request_id === 'string' ? body.request_id : undefined;
    this.operationId = typeof body.operation_id === 'string' ? body.operation_id : undefined;
    this.body = body;
    this.method = request.method;
    this.path = request.path;
    this.retryAfterSecs = retryAfterSecs;
  }

  /** docs/api.md §7: 429, 503 and 504 may be retried; a 500 may not be assumed retryable. */
  get retryable(): boolean {
    return this.status === 429 || this.status === 503 || this.status === 504;
  }
}

export class BadRequestProblem extends CantoProblem {
  override readonly name = 'BadRequestProblem';
}
export class UnauthorizedProblem extends CantoProblem {
  override readonly name = 'UnauthorizedProblem';
}
export class NotFoundProblem extends CantoProblem {
  override readonly name = 'NotFoundProblem';
}
export class ConflictProblem extends CantoProblem {
  override readonly name = 'ConflictProblem';
}
export class PayloadTooLargeProblem extends CantoProblem {
  override readonly name = 'PayloadTooLargeProblem';
}
export class RateLimitedProblem extends CantoProblem {
  override readonly name = 'RateLimitedProblem';
}
export class NotImplementedProblem extends CantoProblem {
  override readonly name = 'NotImplementedProblem';
}
export class UnavailableProblem extends CantoProblem {
  override readonly name = 'UnavailableProblem';
}
export class GatewayTimeoutProblem extends CantoProblem {
  override readonly name = 'GatewayTimeoutProblem';
}

const CLASSES: Record<number, typeof CantoProblem> = {
  400: BadRequestProblem,
  401: UnauthorizedProblem,
  404: NotFoundProblem,
  409: ConflictProblem,
  413: PayloadTooLargeProblem,
  429: RateLimitedProblem,
  501: NotImplementedProblem,
  503: UnavailableProblem,
  504: GatewayTimeoutProblem,
};

/** The API could not be reached: refused, reset, unresolvable, or out of time. */
export class CantoConnectionError extends Error {
  override readonly name = 'CantoConnectionError';
  /** The Idempotency-Key a keyed call (create, wake, hibernate, destroy, fork) was sent with. */
  idempotencyKey?: string;
  /** `ECONNREFUSED`, `ENOTFOUND`, `TimeoutError`…: the most specific reason known. */
  readonly code: string;
  constructor(
    readonly url: string,
    cause: unknown,
  ) {
    const inner = (cause as { cause?: { code?: string; message?: string } } | undefined)?.cause;
    const code = inner?.code ?? (cause as { name?: string } | undefined)?.name ?? 'Error';
    super(`cannot reach ${url}: ${inner?.code ?? inner?.message ?? (cause as Error | undefined)?.message ?? String(cause)}`, { cause });
    this.code = code;
  }
}

/**
 * The problem a failed answer carries. `body` is what was read of it: parsed JSON, or text when
 * it was not JSON (a proxy's error page), which still becomes a problem with that text as detail.
 */
export function toProblem(response: Response, body: unknown, method: string): CantoProblem {
  const url = new URL(response.url || 'http://unknown/');
  const fromBody = body !== null && typeof body === 'object' ? (body as Partial<ProblemBody>) : {};
  const text = typeof body === 'string' ? body.slice(0, 200) : '';
  const problem: ProblemBody = {
    ...fromBody,
    type: typeof fromBody.type === 'string' ? fromBody.type : 'about:blank',
    title: typeof fromBody.title === 'string' ? fromBody.title : response.statusText,
    status: response.status,
    detail: typeof fromBody.detail === 'string' ? fromBody.detail : text || response.statusText || `HTTP ${response.status}`,
  };
  const Class = CLASSES[response.status] ?? CantoProblem;
  return new Class(problem, { method, path: url.pathname + url.search }, parseRetryAfterSecs(response.headers.get('retry-after')));
}

/** `Retry-After` as seconds from now: delta-seconds or an HTTP date (RFC 9110 10.2.3); null when absent or unreadable. */
export function parseRetryAfterSecs(value: string | null, now = Date.now()): number | null {
  if (value === null || value.trim() === '') return null;
  const trimmed = value.trim();
  if (/^\d+$/.test(trimmed)) return Number(trimmed);
  const date = Date.parse(trimmed);
  return Number.isNaN(date) ? null : Math.max(0, (date - now) / 1000);
}
