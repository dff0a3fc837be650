/**
 * Errors as RFC 9457 problem+json. Services throw `ApiError`s from the catalog below; the one
 * error handler in app.ts turns those, Fastify's own 4xx errors and anything unexpected into a
 * problem body. A 500 body never carries the real error text: that goes to the log only.
 */
import { STATUS_CODES } from 'node:http';

export interface Problem {
  type: 'about:blank';
  title: string;
  status: number;
  detail: string;
  operation_id?: string;
  currentSize?: number;
  request_id?: string;
}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly detail: string,
    readonly extra: { operation_id?: string; currentSize?: number; request_id?: string } = {},
    readonly headers: Record<string, string> = {},
  ) {
    super(detail);
    this.name = 'ApiError';
  }
}

export function problem(status: number, detail: string, extra: ApiError['extra'] = {}): Problem {
  return { type: 'about:blank', title: STATUS_CODES[status] ?? 'Error', status, detail, ...extra };
}

/** The catalog: every error the API raises on purpose. Details never echo caller input or ids. */
export const errors = {
  badRequest: (detail: string) => new ApiError(400, detail),
  unauthorized: () => new ApiError(401, 'missing or invalid credentials'),
  desktopNotFound: () => new ApiError(404, 'desktop not found'),
  operationNotFound: () => new ApiError(404, 'operation not found'),
  webhookNotFound: () => new ApiError(404, 'webhook endpoint not found'),
  keyNotFound: () => new ApiError(404, 'API key not found'),
  wrongState: (action: string, state: string) =>
    new ApiError(409, `cannot ${action} a desktop in state ${state}`),
  operationInFlight: (action: string, op: { id: string; kind: string }) =>
    new ApiError(409, `cannot ${action} the desktop while its ${op.kind} (operation ${op.id}) is in progress; retry once it settles`, { operation_id: op.id }),
  staleGeneration: (operationId: string) =>
    new ApiError(409, 'expected_generation does not match the desktop generation', { operation_id: operationId }),
  operationFailed: (operationId: string, detail: string) =>
    new ApiError(409, `operation failed: ${detail}`, { operation_id: operationId }),
  identityProviderUnavailable: () =>
    new ApiError(503, 'identity provider unreachable; retry', {}, { 'retry-after': '5' }),
  notImplemented: (detail: string) => new ApiError(501, detail),
  notAwake: (state: string) => new ApiError(409, `desktop is ${state}, not awake`),
  desktopMoving: () =>
    new ApiError(503, 'the desktop is moving to another host; retry in a moment', {}, { 'retry-after': '1' }),
  replicaStopping: () =>
    new ApiError(503, 'this scheduler replica is stopping; retry on a new connection', {}, { 'retry-after': '1' }),
  hostUnreachable: () =>
    new ApiError(503, "the desktop's host is unreachable; retry", {}, { 'retry-after': '5' }),
  guestTimeout: () => new ApiError(504, 'the operation did not finish in the guest before its deadline; retry'),
  processNotFound: () => new ApiError(404, 'process not found'),
  pathNotFound: () => new ApiError(404, 'path not found'),
  pathConflict: (detail: string) => new ApiError(409, detail),
  appendMismatch: (currentSize: number) =>
    new ApiError(409, 'append offset does not match the file size', { currentSize }),
  tooLarge: (detail: string) => new ApiError(413, detail),
  controlClaimed: () => new ApiError(409, 'a stream client holds the control claim on this desktop; retry once it is released'),
  streamControlTaken: () => new ApiError(409, 'another stream client holds the control claim on this desktop'),
  /** `detail`: the agent's sentence, which names its limit. */
  viewLimit: (detail: string) => new ApiError(409, `${detail}, counting tickets granted and not yet used; close one first`),
  terminalLimit: () => new ApiError(409, 'the desktop has as many terminals open (or granted) as it may; close one first'),
  /** A failure inside the guest; the detail is a fixed sentence, the agent's text goes to the log. */
  guestFailed: (detail: string) => new ApiError(500, detail),
  noCapacity: (operationId: string, detail: string) => new ApiError(413, detail, { operation_id: operationId }),
  portNotFound: () => new ApiError(404, 'port exposure not found'),
  portAlreadyExposed: () => new ApiError(409, 'the port is already exposed on this desktop; to rotate its token, delete and re-create it'),
  ingressDisabled: () => new ApiError(501, 'the port ingress is not enabled on this deployment'),
  /* The port ingress's answers (docs/api.md §4.7). One 404 for every URL that leads nowhere, whatever the reason. */
  ingressNotFound: () => new ApiError(404, 'not found'),
  ingressUnauthorized: () => new ApiError(401, 'missing or invalid port token (svc_token query parameter or X-Svc-Token header)'),
  portUnbound: () =>
    new ApiError(503, 'the port is unbound: its desktop is not awake or its host is unreachable; retry', {}, { 'retry-after': '5' }),
  portRefused: () => new ApiError(502, 'nothing accepts connections on this port inside the desktop'),
  portLinkFailed: () => new ApiError(502, "the desktop's host did not answer the port link as expected"),
  /* The admin API's answers (scheduler/src/admin/). */
  adminApiOff: () =>
    new ApiError(503, 'the admin API is off on this replica: start it with CANTO_ADMIN_TOKEN set (at least 32 characters; `canto up` generates one into secrets.json)'),
  hostNotFound: () => new ApiError(404, 'host not found'),
  orgNotFound: () => new ApiError(404, 'org not found'),
  orgExists: () => new ApiError(409, 'an org with this name exists'),
  hostHoldsDesktops: (count: number) =>
    new ApiError(409, `the host holds ${count} desktop(s); move them off (drain the host) before removing it`),
  desktopQuota: (quota: number) =>
    new ApiError(409, `the org's desktop quota (${quota}) would be exceeded: destroy desktops it no longer needs first`),
  hostKeyInUse: () =>
    new ApiError(409, "the host is up: its agent holds its key; stop the agent first (a key is reset only for an agent that lost it)"),
  hostUpNotLost: () =>
    new ApiError(409, "the host's agent is connected: a host that is up is not lost; drain it to keep its desktops, or stop its agent first"),
  hostStillLinked: () =>
    new ApiError(409, "the host's agent is still connected; stop the agent (after draining the host), wait until the host reads down, then remove it"),
} as const;
