/**
 * Fetching a unit's stream raw (RAW_UNIT_PROTOCOL, shared/src/transfer.ts): one GET that asks
 * to upgrade, then the unit's bytes with nothing around them but the digest at the end.
 *
 * Why not Node's HTTP client: it hands every piece of a response body over in a buffer of its
 * own, and at a move's rate those buffers are what V8's collector spends its time on. Here the
 * socket reads into one buffer and the bytes go into slabs used again (runtime/slabs.ts), handed
 * back once the spool file and the unpacking have written them.
 *
 * A source that predates the protocol answers the plain stream (`200`): `openRawUnit` then
 * answers null and the caller uses the HTTP client (client.ts). Refusals are the same problem
 * answers as there, and become the same errors.
 */
import { connect, type Socket } from 'node:net';
import { RAW_DIGEST_CHARS, RAW_UNIT_PROTOCOL } from '../../../shared/src/transfer.js';
import { AgentFailure } from '../../../shared/src/protocol.js';
import { READ_BYTES, SlabQueue, type SlabTaker } from '../runtime/slabs.js';
import { classify, refusalFor, TransientFetchError, type GetOptions } from './client.js';

/** More header bytes than this is not a transfer server answering. */
const MAX_HEAD_BYTES = 16 << 10;
/** Bytes of a refusal's body kept for its message. */
const MAX_REFUSAL_BYTES = 2000;
/**
 * Answers after which the same request goes again without the upgrade: the plain stream itself
 * (a source that predates the protocol), and what a proxy that will not upgrade says.
 */
const PLAIN_INSTEAD = new Set([200, 400, 405, 426, 501, 505]);

export interface RawUnitBody {
  /** The size of the whole unit as the source has it now; null for a stream of unknown length. */
  readonly unitBytes: number | null;
  /**
   * Reads the rest of the unit into `take`, in order; resolves with the whole stream's sha256
   * (hex, as the source computed it) once every byte and the digest came. On a broken
   * connection the bytes that did come are all handed over before it rejects.
   */
  read(take: SlabTaker): Promise<string>;
  destroy(): void;
}

/**
 * Asks for the unit at `url` (its path and query) from `offset`, raw; null when the source
 * cannot. With a null offset, a stream whose length is not known ahead (a pre-copy): its bytes
 * run to the connection's end, whose last 64 characters are the digest, and a connection reset
 * is a cut.
 */
export function openRawUnit(url: URL, offset: number | null, options: GetOptions, onSent?: () => void): Promise<RawUnitBody | null> {
  if (!/^[\x21-\x7e]+$/.test(options.ticket)) return Promise.reject(new AgentFailure('bad_request', 'the transfer ticket is not a token', false));
  return new RawUnitConnection(url, offset, options, onSent).opened;
}

/** `rest`: the body of a stream of unknown length, its last 64 bytes held back as the digest may be them. */
type State = 'head' | 'refused' | 'body' | 'digest' | 'rest' | 'done';

class RawUnitConnection implements RawUnitBody {
  readonly opened: Promise<RawUnitBody | null>;
  unitBytes: number | null = null;
  private settleOpen!: { resolve: (body: RawUnitBody | null) => void; reject: (err: Error) => void };
  private readonly socket: Socket;
  private state: State = 'head';
  private head = Buffer.alloc(0);
  private status = 0;
  private refusalLeft = 0;
  private refusalText = '';
  private bodyLeft = 0;
  private digest = '';
  /** Of a stream of unknown length, the last bytes read (at most the digest's length). */
  private tail = Buffer.alloc(0);
  private readonly queue = new SlabQueue({ idle: () => this.idle(), failed: (err) => this.finish(err) });
  private reading = false;
  private failure: Error | null = null;
  private settleRead: { resolve: (digest: string) => void; reject: (err: Error) => void } | null = null;

  constructor(
    url: URL,
    private readonly offset: number | null,
    private readonly options: GetOptions,
    onSent?: () => void,
  ) {
    this.opened = new Promise((resolve, reject) => (this.settleOpen = { resolve, reject }));
    const buffer = Buffer.allocUnsafeSlow(READ_BYTES);
    this.socket = connect({
      host: url.hostname.replace(/^\[|\]$/g, ''),
      port: Number(url.port || 80),
      onread: { buffer, callback: (n: number, buf: Uint8Array) => this.onRead(buf as Buffer, n) },
    });
    const request = `GET ${url.pathname}${url.search} HTTP/1.1\r\nhost: ${url.host}\r\nauthorization: Bearer ${options.ticket}\r\n`
      + `connection: Upgrade\r\nupgrade: ${RAW_UNIT_PROTOCOL}\r\n\r\n`;
    this.socket.write(request, () => onSent?.());
    this.socket.setTimeout(options.idleTimeoutMs, () => this.socket.destroy(new TransientFetchError(`no bytes from the source for ${options.idleTimeoutMs} ms`)));
    const aborted = () => this.socket.destroy(new Error('aborted'));
    options.signal?.addEventListener('abort', aborted, { once: true });
    this.socket.once('close', () => options.signal?.removeEventListener('abort', aborted));
    this.socket.on('error', (err) => this.fail(err));
    this.socket.once('end', () => this.ended());
    this.socket.once('close', () => this.fail(new TransientFetchError('the connection closed before the unit ended')));
    if (options.signal?.aborted) aborted();
  }

  read(take: SlabTaker): Promise<string> {
    if (this.reading) return Promise.reject(new Error('the unit is already being read'));
    this.reading = true;
    const reading = new Promise<string>((resolve, reject) => (this.settleRead = { resolve, reject }));
    this.queue.take(take);
    return reading;
  }

  destroy(): void {
    this.socket.destroy();
  }

  /** A socket read: `n` bytes in the read buffer, which the next read overwrites. */
  private onRead(buf: Buffer, n: number): boolean {
    try {
      let at = 0;
      if (this.state === 'head') at = this.readHead(buf, n);
      if (this.state === 'refused') this.readRefusal(buf, at, n);
      else if (at < n) this.readBody(buf, at, n);
    } catch (err) {
      this.socket.destroy(err instanceof Error ? err : new Error(String(err)));
      return false;
    }
    this.queue.pump();
    // Paused while a chunk waits to be taken; idle() resumes.
    return this.queue.idle;
  }

  /** Gathers the answer's head; answers where its body starts in `buf` (n when it has not yet). */
  private readHead(buf: Buffer, n: number): number {
    const before = this.head.length;
    this.head = Buffer.concat([this.head, buf.subarray(0, n)]);
    const end = this.head.indexOf('\r\n\r\n');
    if (end < 0) {
      if (this.head.length > MAX_HEAD_BYTES) throw new TransientFetchError('the source answered no HTTP');
      return n;
    }
    const [statusLine = '', ...lines] = this.head.subarray(0, end).toString('latin1').split('\r\n');
    const headers = new Map(lines.map((line) => {
      const colon = line.indexOf(':');
      return [line.slice(0, colon).trim().toLowerCase(), line.slice(colon + 1).trim()] as const;
    }));
    this.head = Buffer.alloc(0);
    this.status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(statusLine)?.[1] ?? 0);
    const bodyAt = end + 4 - before;
    if (PLAIN_INSTEAD.has(this.status)) {
      // A source without the protocol, or something on the way that refuses upgrades: the caller
      // asks again over plain HTTP, whose answer (a real refusal too) then stands.
      this.state = 'done';
      this.settleOpen.resolve(null);
      this.socket.destroy();
      return n;
    }
    if (this.status !== 101) {
      this.state = 'refused';
      this.refusalLeft = Number(headers.get('content-length') ?? MAX_REFUSAL_BYTES);
      return bodyAt;
    }
    const unitBytes = Number(headers.get('x-canto-unit-bytes'));
    const unfit = () => new TransientFetchError('the source answered the raw stream with headers that do not fit the request');
    if (headers.get('upgrade')?.toLowerCase() !== RAW_UNIT_PROTOCOL) throw unfit();
    if (this.offset === null) {
      if (headers.has('x-canto-unit-bytes')) throw unfit();
      this.state = 'rest';
    } else {
      if (Number(headers.get('x-canto-offset')) !== this.offset || !Number.isSafeInteger(unitBytes) || unitBytes < this.offset) throw unfit();
      this.unitBytes = unitBytes;
      this.bodyLeft = unitBytes - this.offset;
      this.state = this.bodyLeft === 0 ? 'digest' : 'body';
    }
    this.settleOpen.resolve(this);
    return bodyAt;
  }

  private readRefusal(buf: Buffer, at: number, n: number): void {
    const k = Math.min(n - at, this.refusalLeft);
    if (this.refusalText.length < MAX_REFUSAL_BYTES) this.refusalText += buf.toString('utf8', at, at + k);
    this.refusalLeft -= k;
    if (this.refusalLeft === 0) this.refuse();
  }

  private refuse(): void {
    this.state = 'done';
    this.settleOpen.reject(refusalFor(this.status, this.refusalText));
    this.socket.destroy();
  }

  /** Copies body bytes into slabs (handing each full one over), then the digest. */
  private readBody(buf: Buffer, from: number, n: number): void {
    let at = from;
    while (at < n) {
      if (this.state === 'body') {
        const k = Math.min(n - at, this.bodyLeft);
        this.queue.copy(buf, at, at + k, this.bodyLeft);
        this.bodyLeft -= k;
        at += k;
        if (this.bodyLeft === 0) {
          this.queue.seal();
          this.state = 'digest';
        }
      } else if (this.state === 'rest') {
        this.holdBack(buf, at, n);
        at = n;
      } else if (this.state === 'digest') {
        const k = Math.min(n - at, RAW_DIGEST_CHARS - this.digest.length);
        this.digest += buf.toString('latin1', at, at + k);
        at += k;
        if (this.digest.length === RAW_DIGEST_CHARS) this.state = 'done';
      } else {
        throw new TransientFetchError('the source sent more than the unit and its digest');
      }
    }
  }

  /** Bytes of a stream of unknown length: all but the last 64 read so far are the body's. */
  private holdBack(buf: Buffer, from: number, to: number): void {
    let pass = this.tail.length + (to - from) - RAW_DIGEST_CHARS;
    if (pass <= 0) {
      this.tail = Buffer.concat([this.tail, buf.subarray(from, to)]);
      return;
    }
    const fromTail = Math.min(pass, this.tail.length);
    if (fromTail > 0) this.queue.copy(this.tail, 0, fromTail);
    pass -= fromTail;
    if (pass > 0) this.queue.copy(buf, from, from + pass);
    this.tail = Buffer.concat([this.tail.subarray(fromTail), buf.subarray(from + pass, to)]);
  }

  /** The source ended the connection: the end of a stream of unknown length, or a cut. */
  private ended(): void {
    if (this.state === 'rest' && this.failure === null && this.tail.length === RAW_DIGEST_CHARS) {
      this.digest = this.tail.toString('latin1');
      this.state = 'done';
      this.queue.seal();
      this.queue.pump();
      return;
    }
    this.fail(new TransientFetchError('the connection closed before the unit ended'));
  }

  /** Everything handed over is taken: the read settles, or the socket reads on. */
  private idle(): void {
    if (this.state === 'done') this.finish(null);
    else if (this.failure !== null) this.finish(this.failure);
    else this.socket.resume();
  }

  /** The connection ended or broke: what came is handed over, then the read fails. */
  private fail(err: Error): void {
    if (this.failure !== null || this.state === 'done') return;
    this.failure = classify(err, this.options.signal);
    if (this.state === 'head') {
      this.settleOpen.reject(this.failure);
      return;
    }
    if (this.state === 'refused') {
      this.refuse();
      return;
    }
    this.queue.seal();
    this.queue.pump();
  }

  private finish(err: Error | null): void {
    const settle = this.settleRead;
    if (settle === null) return;
    this.settleRead = null;
    this.socket.destroy();
    // A taker's own error (a unit found wrong) stays what it is.
    if (err === null) settle.resolve(this.digest);
    else settle.reject(err);
  }
}
