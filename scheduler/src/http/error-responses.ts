/**
 * The error responses of the OpenAPI document: every answer that is not a success is an RFC 9457
 * problem (one schema, `Problem`), and a 503 may carry Retry-After. Route modules list the
 * statuses they add to the ones every authenticated route can give.
 */
import { RETRY_AFTER_HEADER } from './operations-doc.js';

/** Error responses every authenticated route can give, for the OpenAPI document. */
export function errorResponses(...statuses: number[]): Record<number, unknown> {
  const response = {
    description: 'RFC 9457 problem details',
    content: { 'application/problem+json': { schema: { $ref: 'Problem#' } } },
  };
  const unavailable = { ...response, description: 'RFC 9457 problem details; retryable, after Retry-After seconds when given', headers: RETRY_AFTER_HEADER };
  // 400: any request can be malformed (a bad percent-encoding in its path or query, say).
  return Object.fromEntries([400, 401, 500, 503, ...statuses].map((s) => [s, s === 503 ? unavailable : response]));
}
