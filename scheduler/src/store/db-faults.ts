/**
 * Database faults the server means to be passing: a serialization failure, a deadlock, a server
 * shutting down or restarting, too many connections, a link that broke. The engine runs a step
 * cut short by one again (engine.ts); the API answers one 503 with Retry-After, the contract's
 * retryable class (http/app.ts), not a 500 a client may not retry.
 */
import { AgentFailure } from '../../../shared/src/protocol.js';

/** SQLSTATEs of faults the server means to be passing: a serialization failure, a deadlock, a shutdown, too many connections. */
const PASSING_SQLSTATES = new Set(['40001', '40P01', '57P01', '57P02', '57P03', '53300']);
/** The database client's codes for a link that failed (postgres.js's, and the socket's). */
const LINK_FAILURES = new Set(['CONNECTION_CLOSED', 'CONNECTION_ENDED', 'CONNECTION_DESTROYED', 'CONNECT_TIMEOUT', 'ECONNRESET', 'ECONNREFUSED', 'EPIPE', 'ETIMEDOUT']);
/** Also passing for a request, which the client repeats: a statement or lock wait that timed out. */
const REQUEST_TIMEOUTS = new Set(['57014', '55P03']);

/** Whether `err` is a database fault the server means to be passing (or a link to it that failed). */
export function passingDatabaseFault(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  if (typeof code !== 'string' || err instanceof AgentFailure) return false;
  return code.startsWith('08') || PASSING_SQLSTATES.has(code) || LINK_FAILURES.has(code);
}

/** Whether a request that failed on `err` may simply be sent again: answered 503 with Retry-After. */
export function retryableDatabaseFault(err: unknown): boolean {
  if (passingDatabaseFault(err)) return true;
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' && !(err instanceof AgentFailure) && REQUEST_TIMEOUTS.has(code);
}
