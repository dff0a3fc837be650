/**
 * Reads one HTTP/1.x answer off a port link, as bytes arrive: the head (status line and
 * headers), then the body as its framing says (RFC 9112 §6.3) — none (a HEAD request, 1xx, 204,
 * 304), `Content-Length` bytes, chunks (decoded here: the client's side frames the body again
 * as its own connection needs), or everything until the link ends. Interim 1xx answers are
 * skipped (the ingress answered the client's `Expect` itself). It knows when the answer is
 * complete and whether the link may carry another request: HTTP/1.1 without `Connection: close`
 * (or 1.0 with `keep-alive`), a delimited body, and nothing after the answer.
 *
 * Hop-by-hop headers of the answer (`Connection`, `Keep-Alive`, `Transfer-Encoding`,
 * `Proxy-Connection`) are not handed on; everything else is, in order, duplicates kept, cookies
 * without a `Domain` (hostOnlyCookie). Anything
 * that is not HTTP throws, and the ingress answers 502 (or cuts the client off, once the answer
 * has begun).
 */

/**
 * A cookie without its `Domain` attributes, so the browser keeps it for the exposure's own host.
 * Every exposure is a name under one ingress domain: a cookie an app scoped to that domain would
 * reach every other tenant's exposures (and theirs would reach it).
 */
export function hostOnlyCookie(value: string): string {
  if (!/domain/i.test(value)) return value;
  const [pair, ...attributes] = value.split(';');
  return [pair, ...attributes.filter((a) => a.split('=', 1)[0]!.trim().toLowerCase() !== 'domain')].join(';');
}

/** A head larger than this is not an answer the ingress relays. */
const MAX_HEAD_BYTES = 64 * 1024;
/** Nor a chunk-size line (with its extensions) or a trailer line longer than this. */
const MAX_LINE_BYTES = 8 * 1024;
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'transfer-encoding', 'proxy-connection']);
const STATUS_LINE = /^HTTP\/1\.([01]) (\d{3})(?: (.*))?$/;
const CRLF = Buffer.from('\r\n');

export interface ResponseHead {
  readonly status: number;
  readonly reason: string;
  /** Name, value, name, value, ...: what the client is sent. */
  readonly headers: string[];
}

type State = 'head' | 'length' | 'chunk-size' | 'chunk-data' | 'chunk-end' | 'trailers' | 'close' | 'complete';

export class ResponseReader {
  private state: State = 'head';
  private pending: Buffer | null = null;
  private left = 0;
  /** Whether the link may carry another request after this answer. */
  keepAlive = false;
  /** Bytes arrived behind the complete answer: the link is out of step and must not be reused. */
  extraBytes = false;
  /** Whether the final head was read. */
  started = false;

  constructor(private readonly headRequest: boolean) {}

  /** Whether the body runs until the link ends (so an end completes the answer). */
  get endsAtClose(): boolean {
    return this.state === 'close';
  }

  /**
   * Consumes `chunk`: `onHead` gets the final head (returning false stops reading), `onBody` each
   * piece of the body. Answers 'complete' once the whole answer has been read.
   */
  push(chunk: Buffer, onHead: (head: ResponseHead) => boolean, onBody: (body: Buffer) => void): 'more' | 'complete' | 'stopped' {
    let buf = this.pending === null ? chunk : Buffer.concat([this.pending, chunk]);
    this.pending = null;
    while (buf.length > 0) {
      switch (this.state) {
        case 'head': {
          const end = buf.indexOf('\r\n\r\n');
          if (end === -1) {
            if (buf.length > MAX_HEAD_BYTES) throw new Error('the answer\'s head is too large');
            this.pending = buf;
            return 'more';
          }
          const head = this.parseHead(buf.toString('latin1', 0, end));
          buf = buf.subarray(end + 4);
          if (head === null) continue; // an interim 1xx
          this.started = true;
          if (!onHead(head)) return 'stopped';
          break;
        }
        case 'length':
          buf = this.counted(buf, onBody, 'complete');
          break;
        case 'chunk-size': {
          const line = this.line(buf);
          if (line === null) return 'more';
          buf = buf.subarray(line.length + 2);
          const size = /^([0-9a-fA-F]{1,12})[ \t]*(;.*)?$/.exec(line.toString('latin1'));
          if (!size) throw new Error('a malformed chunk size');
          this.left = parseInt(size[1]!, 16);
          this.state = this.left === 0 ? 'trailers' : 'chunk-data';
          break;
        }
        case 'chunk-data':
          buf = this.counted(buf, onBody, 'chunk-end');
          break;
        case 'chunk-end': {
          if (buf.length < 2) {
            this.pending = buf;
            return 'more';
          }
          if (buf[0] !== 0x0d || buf[1] !== 0x0a) throw new Error('a chunk without its CRLF');
          buf = buf.subarray(2);
          this.state = 'chunk-size';
          break;
        }
        case 'trailers': {
          // Trailers are not relayed (the proxy library did not either); an empty line ends them.
          const line = this.line(buf);
          if (line === null) return 'more';
          buf = buf.subarray(line.length + 2);
          if (line.length === 0) this.state = 'complete';
          break;
        }
        case 'close':
          onBody(buf);
          return 'more';
        case 'complete':
          this.extraBytes = true;
          return 'complete';
      }
      if (this.state === 'complete') {
        if (buf.length > 0) this.extraBytes = true;
        return 'complete';
      }
    }
    return this.state === 'complete' ? 'complete' : 'more';
  }

  /** The line at the start of `buf` without its CRLF, or null (kept pending) until it is whole. */
  /** Passes on up to `left` bytes of body (a length's or a chunk's); `then` once they are all through. Answers the rest. */
  private counted(buf: Buffer, onBody: (body: Buffer) => void, then: State): Buffer {
    const take = Math.min(this.left, buf.length);
    onBody(take === buf.length ? buf : buf.subarray(0, take));
    this.left -= take;
    if (this.left === 0) this.state = then;
    return buf.subarray(take);
  }

  private line(buf: Buffer): Buffer | null {
    const end = buf.indexOf(CRLF);
    if (end !== -1) return buf.subarray(0, end);
    if (buf.length > MAX_LINE_BYTES) throw new Error('a chunk-size or trailer line is too long');
    this.pending = buf;
    return null;
  }

  /** The head for the client, with the body's framing set up; null for an interim 1xx answer. */
  private parseHead(text: string): ResponseHead | null {
    const lines = text.split('\r\n');
    const status = STATUS_LINE.exec(lines[0]!);
    if (!status) throw new Error('the answer is not HTTP/1.x');
    const minor = status[1]!;
    const code = Number(status[2]);
    if (code < 100 || code > 599 || code === 101) throw new Error(`the app answered ${code}`);
    if (code < 200) return null;
    const headers: string[] = [];
    let chunked = false;
    let length: number | null = null;
    let close = minor === '0';
    for (let i = 1; i < lines.length; i++) {
      const line = lines[i]!;
      if (line.startsWith(' ') || line.startsWith('\t')) {
        // Obsolete line folding (RFC 9112 §5.2): the value goes on, after one space.
        if (headers.length === 0) throw new Error('a folded first header');
        headers[headers.length - 1] += ` ${line.trim()}`;
        continue;
      }
      const colon = line.indexOf(':');
      if (colon <= 0) throw new Error('a malformed header line');
      const name = line.slice(0, colon);
      const value = line.slice(colon + 1).trim();
      const lower = name.toLowerCase();
      if (lower === 'content-length') {
        if (!/^\d{1,15}$/.test(value) || (length !== null && length !== Number(value))) throw new Error('a malformed Content-Length');
        length = Number(value);
      }
      if (HOP_BY_HOP.has(lower)) {
        if (lower === 'transfer-encoding') {
          chunked = /(^|,)\s*chunked\s*$/i.test(value);
          // Other codings (`gzip, chunked`) stay on the body once the chunks are undone: the client
          // is told, and Node's server chunks again under the same header.
          if (chunked && value.trim().toLowerCase() !== 'chunked') headers.push(name, value);
        }
        if (lower === 'connection') {
          const tokens = value.toLowerCase().split(',').map((t) => t.trim());
          if (tokens.includes('close')) close = true;
          else if (minor === '0' && tokens.includes('keep-alive')) close = false;
        }
        continue;
      }
      headers.push(name, lower === 'set-cookie' ? hostOnlyCookie(value) : value);
    }
    if (this.headRequest || code === 204 || code === 304) {
      this.state = 'complete';
    } else if (chunked) {
      // A chunked answer's Content-Length means nothing (RFC 9112 §6.3): the client must not see it.
      if (length !== null) dropHeader(headers, 'content-length');
      this.state = 'chunk-size';
    } else if (length !== null) {
      this.left = length;
      this.state = length === 0 ? 'complete' : 'length';
    } else {
      this.state = 'close';
    }
    this.keepAlive = !close && this.state !== 'close';
    return { status: code, reason: status[3] ?? '', headers };
  }
}

function dropHeader(headers: string[], lower: string): void {
  for (let i = headers.length - 2; i >= 0; i -= 2) if (headers[i]!.toLowerCase() === lower) headers.splice(i, 2);
}
