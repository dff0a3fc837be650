/**
 * The ingress's reader of an app's answer (scheduler/src/ingress/response-reader.ts): framing by
 * Content-Length, chunks, the link's end, or none; interim 1xx answers skipped; hop-by-hop
 * headers kept back; whether the link may be reused. Every answer is also fed one byte at a time,
 * as a link may deliver it.
 */
import { describe, expect, it } from 'vitest';
import { hostOnlyCookie, ResponseReader, type ResponseHead } from '../../scheduler/src/ingress/response-reader.js';

interface Read {
  head: ResponseHead | null;
  body: string;
  step: string;
  reader: ResponseReader;
}

function read(answer: string, opts: { head?: boolean; bytewise?: boolean } = {}): Read {
  const reader = new ResponseReader(opts.head ?? false);
  const out: Read = { head: null, body: '', step: 'more', reader };
  const pieces = opts.bytewise ? [...Buffer.from(answer, 'latin1')].map((b) => Buffer.from([b])) : [Buffer.from(answer, 'latin1')];
  for (const piece of pieces) {
    out.step = reader.push(piece, (h) => ((out.head = h), true), (b) => (out.body += b.toString('latin1')));
    if (out.step === 'complete') break;
  }
  return out;
}

describe('cookies the ingress relays', () => {
  it('lose their Domain, so that they stay with the exposure that set them', () => {
    expect(hostOnlyCookie('s=1; Path=/; Domain=ports.example; HttpOnly')).toBe('s=1; Path=/; HttpOnly');
    expect(hostOnlyCookie('s=1;domain=.ports.example;Secure; DOMAIN=x')).toBe('s=1;Secure');
    // Only the attribute: a value or another attribute that says "domain" stays.
    expect(hostOnlyCookie('domain=example; Path=/domain')).toBe('domain=example; Path=/domain');
    expect(hostOnlyCookie('s=1; Path=/')).toBe('s=1; Path=/');
    const r = read('HTTP/1.1 200 OK\r\nContent-Length: 0\r\nSet-Cookie: a=1; Domain=ports.example; Path=/\r\n\r\n');
    expect(r.head?.headers).toEqual(['Content-Length', '0', 'Set-Cookie', 'a=1; Path=/']);
  });
});

describe.each([false, true])('reading an answer (one byte at a time: %s)', (bytewise) => {
  it('reads a Content-Length body, keeps the link, and hands on everything but hop-by-hop headers', () => {
    const r = read('HTTP/1.1 200 Fine\r\nContent-Length: 5\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n\r\nhello', { bytewise });
    expect(r.step).toBe('complete');
    expect(r.head).toEqual({ status: 200, reason: 'Fine', headers: ['Content-Length', '5', 'Set-Cookie', 'a=1', 'Set-Cookie', 'b=2'] });
    expect(r.body).toBe('hello');
    expect(r.reader.keepAlive).toBe(true);
    expect(r.reader.extraBytes).toBe(false);
  });

  it('decodes chunks (extensions and trailers too) and drops Transfer-Encoding and a stray Content-Length', () => {
    const r = read('HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\nContent-Length: 99\r\nX-A: 1\r\n\r\n4;ext=1\r\nwiki\r\n6\r\npedia \r\nE\r\nin \r\n\r\nchunks.\r\n0\r\nX-Trailer: t\r\n\r\n', { bytewise });
    expect(r.step).toBe('complete');
    expect(r.head).toEqual({ status: 201, reason: 'Created', headers: ['X-A', '1'] });
    expect(r.body).toBe('wikipedia in \r\n\r\nchunks.');
    expect(r.reader.keepAlive).toBe(true);
  });

  it('keeps a Transfer-Encoding with codings besides chunked, for the client\'s side to chunk again', () => {
    const r = read('HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n', { bytewise });
    expect(r.head?.headers).toEqual(['Transfer-Encoding', 'gzip, chunked']);
    expect(r.body).toBe('abc');
  });

  it('reads to the link\'s end when nothing delimits the body, and the link is not reused', () => {
    const r = read('HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end', { bytewise });
    expect(r.step).toBe('more');
    expect(r.reader.endsAtClose).toBe(true);
    expect(r.body).toBe('until the end');
    expect(r.reader.keepAlive).toBe(false);
  });

  it('expects no body for HEAD, 204 and 304, whatever Content-Length says', () => {
    expect(read('HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n', { head: true, bytewise }).step).toBe('complete');
    expect(read('HTTP/1.1 204 No Content\r\n\r\n', { bytewise }).step).toBe('complete');
    const notModified = read('HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\nETag: "x"\r\n\r\n', { bytewise });
    expect(notModified.step).toBe('complete');
    expect(notModified.head?.headers).toEqual(['Content-Length', '10', 'ETag', '"x"']);
  });

  it('skips interim 1xx answers', () => {
    const r = read('HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok', { bytewise });
    expect(r.head?.status).toBe(200);
    expect(r.body).toBe('ok');
  });

  it('does not reuse the link after Connection: close, or an HTTP/1.0 answer without keep-alive', () => {
    expect(read('HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n', { bytewise }).reader.keepAlive).toBe(false);
    expect(read('HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n', { bytewise }).reader.keepAlive).toBe(false);
    expect(read('HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 0\r\n\r\n', { bytewise }).reader.keepAlive).toBe(true);
  });
});

describe('an answer that is not HTTP, or out of step', () => {
  it('throws on a bad status line, a bad Content-Length, a 101, a bad chunk size', () => {
    expect(() => read('SSH-2.0-OpenSSH\r\n\r\n')).toThrow();
    expect(() => read('HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n')).toThrow();
    expect(() => read('HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n')).toThrow();
    expect(() => read('HTTP/1.1 101 Switching Protocols\r\n\r\n')).toThrow();
    expect(() => read('HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n')).toThrow();
    expect(() => read('HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokXX')).toThrow();
  });

  it('throws on a head that never ends', () => {
    expect(() => read(`HTTP/1.1 200 OK\r\n${'X-Pad: y\r\n'.repeat(10_000)}`)).toThrow(/too large/);
  });

  it('notes bytes behind the answer, so the link is not reused', () => {
    const r = read('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n');
    expect(r.step).toBe('complete');
    expect(r.body).toBe('ok');
    expect(r.reader.extraBytes).toBe(true);
  });
});
