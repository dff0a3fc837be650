/**
 * The byte streams of the agent link: uploads (bytes a request carries to its handler) and
 * downloads (bytes a handler sends after its reply), for one `RpcPeer` (rpc.ts), which owns the
 * socket and the request/reply half and hands stream frames here.
 *
 * Stream bytes travel in one of two ways. Every peer reads both; which one it sends depends on the
 * other side's protocol, learnt at hello (`binaryStreams`). The original form is a msgpack
 * `stream.up`/`stream.down` notification per chunk, which copies each chunk into the encoder's
 * buffer on one side and out of the frame on the other. From protocol 1.6 a chunk is two
 * websocket messages instead: a ten-byte header (0xc1, which msgpack never uses as a first byte;
 * the direction; the request id; the length) and then the raw bytes as their own message, so a
 * chunk goes out exactly as it was read and arrives as one buffer. The end and the abort of a
 * stream stay msgpack notifications: they are rare, and their order after the data is kept because
 * one websocket delivers messages in order.
 *
 * Raw streams are flow-controlled. A sender keeps at most `STREAM_WINDOW_BYTES` unacknowledged and
 * then stops pulling its source, so the bytes wait where they came from (a client's socket, a file)
 * instead of in the receiver's memory; the receiver credits what its consumer has taken with an
 * ack header (no bytes follow). A download whose consumer gives up is cancelled with another
 * header, and an upload stops when its request is answered: a sender never waits for credit that
 * cannot come. Without flow control, an upload arriving while its handler still opened the file
 * sat whole in the handler's heap, long enough to be promoted and cost full collections.
 *
 * Raw chunks sent in one turn of the event loop leave together: the link's TCP socket is corked at
 * the first and uncorked once the turn's I/O callbacks are done, so the kernel sees one writev
 * instead of two per chunk. On loopback each send also runs the receiver's TCP processing, and an
 * 8 MiB upload arrives from HTTP in about 150 pieces: batching cut the sender's CPU per 8 MiB
 * from 16-18 ms to 11-12 ms on a two-core machine.
 */
import { Socket } from 'node:net';
import type WebSocket from 'ws';
import { IncomingBytes, StreamAborted, StreamFrame, rechunk } from './byte-stream.js';
import { AgentFailure, parseMessage, WIRE_VERSION, type RequestFrame } from './protocol.js';

export const STREAM_UP = 'stream.up';
export const STREAM_DOWN = 'stream.down';
export type StreamType = typeof STREAM_UP | typeof STREAM_DOWN;

/** First byte of a raw chunk's header: a byte msgpack never produces (see the module comment). */
const RAW_MARK = 0xc1;
const RAW_UP = 1;
const RAW_DOWN = 2;
/** Control headers, no bytes follow: credit for an upload / a download, and a download given up. */
const RAW_ACK_UP = 3;
const RAW_ACK_DOWN = 4;
const RAW_CANCEL_DOWN = 5;
const RAW_HEADER_BYTES = 10;
/** Unacknowledged bytes a raw stream's sender may have in flight. */
export const STREAM_WINDOW_BYTES = 4 * 1024 * 1024;
/** A receiver acknowledges once its consumer has taken this much. */
const STREAM_ACK_BYTES = 1024 * 1024;

/** The sending side of a raw stream: bytes in flight, and a pump waiting for credit. */
interface Outgoing {
  inFlight: number;
  stopped: boolean;
  wake: (() => void) | null;
}

/** What the streams need of their peer. */
export interface StreamLink {
  readonly socket: WebSocket;
  /** True once the link is closed: nothing more is sent. */
  isClosed(): boolean;
  /** Sends a msgpack frame (closing the link if the socket throws). */
  send(frame: object): void;
  /** Closes the link after a failed send. */
  shutdown(): void;
  protocolError(message: string): void;
}

function rawHeader(direction: number, id: number, length: number): Buffer {
  const header = Buffer.allocUnsafe(RAW_HEADER_BYTES);
  header[0] = RAW_MARK;
  header[1] = direction;
  header.writeUInt32BE(id, 2);
  header.writeUInt32BE(length, 6);
  return header;
}

/**
 * The websocket's TCP socket. `ws` keeps it in `_socket`, which it does not document; without
 * one (another transport, a future `ws`), chunks simply go out one by one.
 */
function transportOf(ws: WebSocket): Socket | null {
  const socket = (ws as unknown as { _socket?: unknown })._socket;
  return socket instanceof Socket ? socket : null;
}

export class LinkStreams {
  /** Uploads to requests this peer is handling, by the remote request id. */
  private readonly uploads = new Map<number, IncomingBytes>();
  /** Downloads of requests this peer sent, by request id. */
  private readonly downloads = new Map<number, IncomingBytes>();
  /** Send stream chunks as raw messages: the other side speaks protocol 1.6 or later. */
  raw = false;
  /** The header of a raw chunk whose bytes are the next message. */
  private rawPending: { direction: number; id: number; length: number } | null = null;
  /** Incoming streams that received raw chunks: their senders wait for credit. */
  private readonly rawFed = new WeakSet<IncomingBytes>();
  /** Raw streams this peer is sending, by direction and request id. */
  private readonly outgoing = new Map<string, Outgoing>();
  /** The TCP socket is corked until the end of this event-loop turn. */
  private corked = false;

  constructor(private readonly link: StreamLink) {}

  /** The body of a download the request `id` will ask for; registered by `startDownload`. */
  downloadBody(id: number): IncomingBytes {
    const body = this.incoming(RAW_ACK_DOWN, id, () => {
      // Given up before its end: the handler's pump stops instead of waiting for credit.
      if (this.downloads.delete(id) && (this.raw || this.rawFed.has(body))) this.sendControl(RAW_CANCEL_DOWN, id, 0);
    });
    return body;
  }

  startDownload(id: number, body: IncomingBytes): void {
    this.downloads.set(id, body);
  }

  /** The request failed: it gets no body, so frames stop being routed to it. */
  failDownload(id: number, body: IncomingBytes | null, reason: string): void {
    this.downloads.delete(id);
    body?.fail(new StreamAborted(reason));
  }

  /** The upload of an incoming request, readable by its handler. */
  acceptUpload(id: number): IncomingBytes {
    const upload = this.incoming(RAW_ACK_UP, id);
    this.uploads.set(id, upload);
    return upload;
  }

  /** The request was answered: bytes its handler did not read are dropped from here on. */
  endUpload(id: number): void {
    this.uploads.delete(id);
  }

  /** The request `id` was answered: its upload stops, and gets no more credit. */
  stopUpload(id: number): void {
    const out = this.outgoing.get(`${RAW_UP}:${id}`);
    if (out === undefined) return;
    out.stopped = true;
    out.wake?.();
  }

  /**
   * Takes a websocket message if it belongs to a raw stream (a header, or the bytes after one);
   * false when it is a msgpack frame for the peer.
   */
  receiveRaw(data: Buffer): boolean {
    if (this.rawPending !== null) {
      this.receiveRawBytes(data);
      return true;
    }
    if (data[0] !== RAW_MARK) return false;
    const type = data[1] ?? 0;
    if (data.length !== RAW_HEADER_BYTES || type < RAW_UP || type > RAW_CANCEL_DOWN) {
      this.link.protocolError('malformed raw stream header');
      return true;
    }
    const id = data.readUInt32BE(2);
    const value = data.readUInt32BE(6);
    if (type === RAW_UP || type === RAW_DOWN) this.rawPending = { direction: type, id, length: value };
    else this.receiveControl(type, id, value);
    return true;
  }

  /** A `stream.up`/`stream.down` notification: a chunk, the end or an abort. */
  receiveFrame(frame: RequestFrame): void {
    let chunk: StreamFrame;
    try {
      chunk = parseMessage(StreamFrame, frame.payload, frame.type);
    } catch {
      return this.link.protocolError(`malformed ${frame.type} frame`);
    }
    const streams = frame.type === STREAM_UP ? this.uploads : this.downloads;
    const stream = streams.get(chunk.id);
    if (!stream) return; // Its request already finished: nobody reads these bytes any more.
    if (chunk.data) stream.push(chunk.data);
    if (chunk.end || chunk.error !== undefined) {
      streams.delete(chunk.id);
      if (chunk.error !== undefined) stream.fail(new StreamAborted(chunk.error));
      else stream.end();
    }
  }

  /** Sends `source` as stream frames of request `id`; a throwing source becomes an abort frame. */
  async pump(type: StreamType, id: number, source: AsyncIterable<Uint8Array>): Promise<void> {
    const direction = type === STREAM_UP ? RAW_UP : RAW_DOWN;
    const raw = this.raw;
    const key = `${direction}:${id}`;
    const out: Outgoing = { inFlight: 0, stopped: false, wake: null };
    if (raw) this.outgoing.set(key, out);
    try {
      // Raw chunks need no regrouping: each costs two small headers, not a copy. Leaving the
      // loop early (stopped, closed) returns the source, which releases what it holds.
      for await (const data of raw ? source : rechunk(source)) {
        if (this.link.isClosed()) return;
        if (!raw) {
          this.link.send({ v: WIRE_VERSION, type, payload: { id, data } });
          continue;
        }
        if (data.byteLength === 0) continue;
        if (!(await this.credit(out, data.byteLength))) return;
        this.sendRaw(direction, id, data);
      }
      this.link.send({ v: WIRE_VERSION, type, payload: { id, end: true } });
    } catch (err) {
      const reason = err instanceof Error ? err.message : String(err);
      if (!this.link.isClosed()) this.link.send({ v: WIRE_VERSION, type, payload: { id, error: reason.slice(0, 200) || 'aborted' } });
    } finally {
      this.outgoing.delete(key);
    }
  }

  /** The link closed: senders stop, and every stream still open fails as disconnected. */
  closeAll(): void {
    for (const out of this.outgoing.values()) {
      out.stopped = true;
      out.wake?.();
    }
    const lost = new AgentFailure('disconnected', 'agent link closed during a transfer', true);
    for (const stream of [...this.uploads.values(), ...this.downloads.values()]) stream.fail(lost);
    this.uploads.clear();
    this.downloads.clear();
  }

  /**
   * An incoming stream that credits its sender as its consumer takes bytes. Only a raw sender
   * waits for credit, so only a stream that received raw chunks is acknowledged.
   */
  private incoming(ackType: number, id: number, abandoned?: () => void): IncomingBytes {
    let unacked = 0;
    const stream: IncomingBytes = new IncomingBytes({
      consumed: (bytes) => {
        if (!this.rawFed.has(stream)) return;
        unacked += bytes;
        if (unacked < STREAM_ACK_BYTES) return;
        this.sendControl(ackType, id, unacked);
        unacked = 0;
      },
      ...(abandoned ? { abandoned } : {}),
    });
    return stream;
  }

  private sendControl(type: number, id: number, value: number): void {
    if (this.link.isClosed()) return;
    try {
      this.link.socket.send(rawHeader(type, id, value));
    } catch {
      this.link.shutdown();
    }
  }

  private receiveControl(type: number, id: number, value: number): void {
    const direction = type === RAW_ACK_UP ? RAW_UP : RAW_DOWN;
    const out = this.outgoing.get(`${direction}:${id}`);
    if (out === undefined) return; // Finished meanwhile.
    if (type === RAW_CANCEL_DOWN) out.stopped = true;
    else out.inFlight = Math.max(0, out.inFlight - value);
    out.wake?.();
  }

  /** Until `bytes` more fit in the window; false when the stream was stopped (or the link closed). */
  private async credit(out: Outgoing, bytes: number): Promise<boolean> {
    // A chunk larger than the window goes alone.
    while (!out.stopped && !this.link.isClosed() && out.inFlight > 0 && out.inFlight + bytes > STREAM_WINDOW_BYTES) {
      await new Promise<void>((resolve) => (out.wake = resolve));
      out.wake = null;
    }
    if (out.stopped || this.link.isClosed()) return false;
    out.inFlight += bytes;
    return true;
  }

  private sendRaw(direction: number, id: number, data: Uint8Array): void {
    if (data.byteLength === 0) return;
    this.batchTurn();
    try {
      this.link.socket.send(rawHeader(direction, id, data.byteLength));
      this.link.socket.send(data);
    } catch {
      this.link.shutdown();
    }
  }

  /** Holds this turn's writes back until its I/O callbacks are done (see the module comment). */
  private batchTurn(): void {
    if (this.corked) return;
    const tcp = transportOf(this.link.socket);
    if (tcp === null) return;
    this.corked = true;
    tcp.cork();
    setImmediate(() => {
      this.corked = false;
      tcp.uncork();
    });
  }

  /** The bytes of the raw chunk whose header came just before. */
  private receiveRawBytes(data: Buffer): void {
    const { direction, id, length } = this.rawPending as NonNullable<typeof this.rawPending>;
    this.rawPending = null;
    if (data.length !== length) return this.link.protocolError('raw stream chunk does not match its header');
    const stream = (direction === RAW_UP ? this.uploads : this.downloads).get(id);
    // Its request already finished: nobody reads these bytes any more.
    if (stream === undefined || length === 0) return;
    this.rawFed.add(stream);
    stream.push(data);
  }
}
