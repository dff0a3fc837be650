/**
 * Answers for requests that never become requests: malformed framing or headers that Node's HTTP
 * parser refuses, and methods no route can take. Node (and Fastify's default handler) answer these
 * with a bare status or a JSON body of their own, or close the socket; every listener of ours
 * answers with problem+json instead, so a client always reads why, and nothing of the request is
 * echoed back.
 */
import { STATUS_CODES, type Server, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { problem } from '../errors.js';

/** The status for a parser error: oversized headers are 431, a timeout 408, the rest 400. */
function statusOf(err: { code?: string }): number {
  if (err.code === 'HPE_HEADER_OVERFLOW') return 431;
  if (err.code === 'ERR_HTTP_REQUEST_TIMEOUT' || err.code === 'ERR_HTTP_HEADERS_TIMEOUT') return 408;
  return 400;
}

const DETAIL: Readonly<Record<number, string>> = {
  400: 'malformed HTTP request',
  405: 'method not allowed',
  408: 'the request was not received in time',
  431: 'request headers are too large',
};

/** Writes a problem+json answer, with `headers` besides, on a raw socket and closes it. */
export function answerRaw(socket: Duplex, status: number, detail = DETAIL[status] ?? 'bad request', headers: Readonly<Record<string, string>> = {}): void {
  if (socket.destroyed || !socket.writable) return;
  const body = JSON.stringify(problem(status, detail));
  const extra = Object.entries(headers).map(([name, value]) => `${name}: ${value}\r\n`).join('');
  socket.end(
    `HTTP/1.1 ${status} ${STATUS_CODES[status] ?? 'Error'}\r\ncontent-type: application/problem+json\r\n` +
      `content-length: ${Buffer.byteLength(body)}\r\n${extra}connection: close\r\n\r\n${body}`,
  );
}

/** For Fastify's `clientErrorHandler` and a server's `clientError` event. */
export function answerClientError(err: Error & { code?: string }, socket: Duplex): void {
  // A reset or a socket already closed has no one left to answer.
  if (err.code === 'ECONNRESET' || err.code === 'EPIPE') {
    socket.destroy();
    return;
  }
  answerRaw(socket, statusOf(err));
}

/**
 * Requests Node answers itself before any route sees them: CONNECT (405, rather than Node's
 * silent close) and an `Expect` other than `100-continue` (417, rather than Node's empty body).
 * Node's server also ends a connection the moment its client half-closes it (sends its request,
 * then shuts down its side), dropping any answer still being made; with `httpAllowHalfOpen` the
 * answer goes out and then the connection ends. A request without a Host header must reach the
 * application (the server is created with `requireHostHeader: false`), which refuses it with
 * problem+json instead of Node's bare 400.
 */
export function answerUnroutable(server: Server): void {
  (server as Server & { httpAllowHalfOpen: boolean }).httpAllowHalfOpen = true;
  server.on('connect', (_req, socket: Duplex) => answerRaw(socket, 405));
  server.on('checkExpectation', (_req, res: ServerResponse) => {
    const body = JSON.stringify(problem(417, 'the only expectation this server meets is 100-continue'));
    res.writeHead(417, { 'content-type': 'application/problem+json', 'content-length': Buffer.byteLength(body), connection: 'close' });
    res.end(body);
  });
}

/** HTTP/1.1 requires a Host header (RFC 9112 3.2); the detail for a request without one. */
export const MISSING_HOST = 'the request has no Host header';
