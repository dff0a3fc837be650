/**
 * One HTTP/1.1 exchange relayed over a port link, by hand. Node's HTTP server has parsed the
 * client's request; its head is written to the link as text and its body streamed behind it
 * (re-chunked when it came chunked), and the app's answer is read straight off the link by a
 * small parser (response-reader.ts) that hands the status and headers to the client's
 * `ServerResponse` and streams the body through, with backpressure both ways. Measured, an
 * `http.ClientRequest` per request (the proxy library's way) cost the ingress several times the
 * CPU of the rest of a proxied request; this relay is most of what remains of it.
 *
 * Hop-by-hop headers stay on their side (RFC 9110 §7.6.1): the client's `Connection` and
 * `Keep-Alive` are not sent on the link, and the app's do not reach the client, whose connection
 * answers what the client asked (or HTTP's default). `Expect: 100-continue` was answered by the
 * ingress's server already, so it is not sent on. The ingress's credential (`X-Svc-Token`) never
 * leaves; `X-Forwarded-For`, `-Port`, `-Proto` are appended to and `X-Forwarded-Host` set when
 * absent, as the proxy library did.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { ResponseReader, type ResponseHead } from './response-reader.js';
import { TOKEN_HEADER } from './port-token.js';

/** Request headers never written on the link; the `x-forwarded-*` ones are written anew. */
const NOT_SENT = new Set([
  'connection', 'keep-alive', 'proxy-connection', 'expect', TOKEN_HEADER, 'x-forwarded-for', 'x-forwarded-port', 'x-forwarded-proto',
]);

export type RelayResult =
  /** The answer reached the client (or the client left); `reusable`: the link can carry another request. */
  | { readonly kind: 'done'; readonly reusable: boolean }
  /** The link failed; `res.headersSent` tells whether the client's answer had begun. */
  | { readonly kind: 'failed'; readonly error: Error };

/** Whether the request carries a body (and so must not be sent twice). */
export function hasBody(req: IncomingMessage): boolean {
  return req.headers['transfer-encoding'] !== undefined || (req.headers['content-length'] !== undefined && req.headers['content-length'] !== '0');
}

/** The request's head as written on the link: hop-by-hop headers and the token left out. */
export function requestHead(req: IncomingMessage): string {
  let head = `${req.method} ${req.url} HTTP/1.1\r\n`;
  const raw = req.rawHeaders;
  const h = req.headers;
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!.toLowerCase();
    // Referer as stripToken left it: without the token of the page it names.
    if (!NOT_SENT.has(name)) head += `${raw[i]}: ${name === 'referer' ? (h.referer ?? raw[i + 1]) : raw[i + 1]}\r\n`;
  }
  const host = h.host;
  const port = (host === undefined ? null : /:(\d+)$/.exec(host)?.[1]) ?? '80';
  head += `x-forwarded-for: ${appended(h['x-forwarded-for'], req.socket.remoteAddress ?? '')}\r\n`;
  head += `x-forwarded-port: ${appended(h['x-forwarded-port'], port)}\r\n`;
  head += `x-forwarded-proto: ${appended(h['x-forwarded-proto'], 'http')}\r\n`;
  if (h['x-forwarded-host'] === undefined) head += `x-forwarded-host: ${host ?? ''}\r\n`;
  // A DELETE or OPTIONS without a body says so, as the proxy library did: some apps wait for one.
  if ((req.method === 'DELETE' || req.method === 'OPTIONS') && !hasBody(req) && h['content-length'] === undefined) head += 'content-length: 0\r\n';
  return head + '\r\n';
}

function appended(prior: string | string[] | undefined, value: string): string {
  const before = Array.isArray(prior) ? prior.join(',') : prior;
  return before ? `${before},${value}` : value;
}

/**
 * Sends `req` on `link` and relays the answer to `res`. `connection` is the client's own
 * `Connection` header, given back on the answer. Never rejects.
 */
export function relay(req: IncomingMessage, res: ServerResponse, link: Socket, head: string, connection: string | undefined): Promise<RelayResult> {
  return new Promise((resolve) => {
    let sentAll = false;
    let settled = false;
    const reader = new ResponseReader(req.method === 'HEAD');
    const chunked = req.headers['transfer-encoding'] !== undefined;

    const settle = (result: RelayResult) => {
      if (settled) return;
      settled = true;
      link.off('data', onLinkData);
      link.off('end', onLinkEnd);
      link.off('close', onLinkClose);
      link.off('drain', resumeReq);
      req.off('data', onReqData);
      req.off('end', onReqEnd);
      res.off('close', onResClose);
      res.off('drain', resumeLink);
      if (result.kind === 'done' && result.reusable) link.resume();
      resolve(result);
    };
    const resumeReq = () => req.resume();
    const resumeLink = () => link.resume();

    const onReqData = (chunk: Buffer) => {
      let ok: boolean;
      if (chunked) {
        link.cork();
        link.write(`${chunk.length.toString(16)}\r\n`, 'latin1');
        link.write(chunk);
        ok = link.write('\r\n', 'latin1');
        link.uncork();
      } else {
        ok = link.write(chunk);
      }
      if (!ok) {
        req.pause();
        link.once('drain', resumeReq);
      }
    };
    const onReqEnd = () => {
      if (chunked) link.write('0\r\n\r\n', 'latin1');
      sentAll = true;
    };

    const onHead = (answer: ResponseHead): boolean => {
      const headers = answer.headers;
      if (connection !== undefined) headers.push('Connection', connection);
      try {
        res.writeHead(answer.status, answer.reason, headers);
      } catch (err) {
        // A header Node will not send (a control character in a value): the app's answer is not HTTP.
        settle({ kind: 'failed', error: err as Error });
        return false;
      }
      return true;
    };
    // The body read from one chunk of the link, handed on after it: an answer that arrives whole
    // (most do) goes out with `res.end`, head and body in one write.
    const pieces: Buffer[] = [];
    const onBody = (body: Buffer) => void pieces.push(body);
    const onLinkData = (chunk: Buffer) => {
      let step;
      try {
        step = reader.push(chunk, onHead, onBody);
      } catch (err) {
        return settle({ kind: 'failed', error: err as Error });
      }
      if (settled) return;
      const body = pieces.length === 0 ? null : pieces.length === 1 ? pieces[0]! : Buffer.concat(pieces);
      pieces.length = 0;
      if (step === 'complete') {
        if (body === null) res.end();
        else res.end(body);
        settle({ kind: 'done', reusable: reader.keepAlive && sentAll && !reader.extraBytes });
      } else if (body !== null && !res.write(body)) {
        link.pause();
        res.once('drain', resumeLink);
      }
    };
    const onLinkEnd = () => {
      if (reader.endsAtClose) {
        res.end();
        return settle({ kind: 'done', reusable: false });
      }
      settle({ kind: 'failed', error: new Error(`the link ended ${reader.started ? 'in the middle of the answer' : 'before the answer'}`) });
    };
    const onLinkClose = () => settle({ kind: 'failed', error: new Error('the link closed before the answer ended') });
    // The client left: nothing more to relay, and the link is in the middle of an exchange.
    const onResClose = () => {
      if (!res.writableFinished) settle({ kind: 'done', reusable: false });
    };

    link.on('data', onLinkData);
    link.on('end', onLinkEnd);
    link.on('close', onLinkClose);
    res.on('close', onResClose);
    if (hasBody(req)) {
      link.write(head, 'latin1');
      req.on('data', onReqData);
      req.on('end', onReqEnd);
    } else {
      sentAll = true;
      link.write(head, 'latin1');
    }
  });
}
