/**
 * One end of the agent link: request/reply over a websocket carrying msgpack frames. Both the
 * agent and the scheduler wrap their socket in an `RpcPeer`.
 *
 * Each outgoing request gets an id and its own timeout in a pending-call registry; when the socket
 * closes every pending call is rejected at once with a retryable `disconnected` failure, so no
 * caller waits for a reply that can no longer come.
 *
 * A request may carry an upload (bytes the handler reads as they arrive) or ask for a download
 * (bytes the handler sends after its reply); see byte-stream.ts. Their frames, raw or msgpack,
 * with flow control, are the business of the peer's `LinkStreams` (rpc-streams.ts). Streams
 * fail, like calls, when the socket closes.
 */
import { Packr } from 'msgpackr';
import type WebSocket from 'ws';
import { WithDownload, type IncomingBytes } from './byte-stream.js';
import { AgentFailure, WIRE_VERSION, isReplyFrame, isRequestFrame, type AgentError, type RequestFrame } from './protocol.js';
import { LinkStreams, STREAM_DOWN, STREAM_UP } from './rpc-streams.js';

const packr = new Packr({ useRecords: false, mapsAsObjects: true });

export function encodeFrame(frame: object): Buffer {
  return packr.pack(frame);
}

export function decodeFrame(data: Buffer): unknown {
  return packr.unpack(data);
}

export interface RequestContext {
  /** The request's upload, when the requester sent one. */
  readonly upload: AsyncIterable<Buffer> | null;
}

/**
 * Handles one request. A handler answering a download request returns `WithDownload`, whose body
 * is sent after the reply.
 */
export type RequestHandler = (payload: unknown, context: RequestContext) => Promise<unknown>;

export interface Download {
  readonly result: unknown;
  readonly body: AsyncIterable<Buffer>;
}

interface PendingCall {
  resolve(value: unknown): void;
  reject(error: Error): void;
  timer: NodeJS.Timeout;
}

export class RpcPeer {
  private nextId = 1;
  private readonly pending = new Map<number, PendingCall>();
  private readonly handlers = new Map<string, RequestHandler>();
  private closed = false;
  private readonly closeListeners: Array<() => void> = [];
  private readonly streams: LinkStreams;

  constructor(
    private readonly socket: WebSocket,
    private readonly onProtocolError: (message: string) => void = () => {},
  ) {
    this.streams = new LinkStreams({
      socket,
      isClosed: () => this.closed,
      send: (frame) => this.send(frame),
      shutdown: () => this.shutdown(),
      protocolError: (message) => this.onProtocolError(message),
    });
    socket.on('message', (data, isBinary) => {
      if (!isBinary) return this.onProtocolError('text frame on a binary link');
      this.receive(Buffer.isBuffer(data) ? data : Buffer.concat(data as Buffer[]));
    });
    socket.on('close', () => this.shutdown());
    socket.on('error', () => this.shutdown());
  }

  get isOpen(): boolean {
    return !this.closed;
  }

  /** From now on, stream chunks go out as raw messages (the other side reads them). */
  set binaryStreams(on: boolean) {
    this.streams.raw = on;
  }

  /** Handles incoming requests (and notifications) of `type`. */
  handle(type: string, handler: RequestHandler): void {
    this.handlers.set(type, handler);
  }

  onClose(listener: () => void): void {
    if (this.closed) listener();
    else this.closeListeners.push(listener);
  }

  /**
   * Sends a request and resolves with the reply's result. With `upload`, the bytes follow the
   * request frame; a source that throws aborts the upload, and the handler sees the abort.
   */
  request(type: string, payload: unknown, timeoutMs: number, upload?: AsyncIterable<Uint8Array>): Promise<unknown> {
    return this.call(type, payload, timeoutMs, upload, null);
  }

  /** Sends a request whose handler answers with a download; the body streams after the reply. */
  async requestDownload(type: string, payload: unknown, timeoutMs: number): Promise<Download> {
    // The id `call` is about to take.
    const body = this.streams.downloadBody(this.nextId);
    const result = await this.call(type, payload, timeoutMs, undefined, body);
    return { result, body };
  }

  private call(
    type: string,
    payload: unknown,
    timeoutMs: number,
    upload: AsyncIterable<Uint8Array> | undefined,
    download: IncomingBytes | null,
  ): Promise<unknown> {
    if (this.closed) {
      return Promise.reject(new AgentFailure('disconnected', 'agent link is closed', true));
    }
    const id = this.nextId++;
    if (download) this.streams.startDownload(id, download);
    const reply = new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new AgentFailure('timeout', `${type} timed out after ${timeoutMs} ms`, true));
      }, timeoutMs);
      this.pending.set(id, { resolve, reject, timer });
      const frame: RequestFrame = { v: WIRE_VERSION, id, type, payload };
      if (upload) frame.upload = true;
      if (download) frame.download = true;
      this.send(frame);
    });
    if (upload) {
      void this.streams.pump(STREAM_UP, id, upload);
      // Answered: the handler reads no more of the upload, and sends no more credit for it.
      void reply.then(
        () => this.streams.stopUpload(id),
        () => this.streams.stopUpload(id),
      );
    }
    // A failed call gets no body: stop routing frames to it.
    reply.catch(() => this.streams.failDownload(id, download, `${type} failed`));
    return reply;
  }

  notify(type: string, payload: unknown): void {
    if (!this.closed) this.send({ v: WIRE_VERSION, type, payload });
  }

  close(code = 1000, reason = ''): void {
    this.socket.close(code, reason);
    this.shutdown();
  }

  /** Drops the link without a closing handshake: the other end has gone silent. */
  terminate(): void {
    this.socket.terminate();
    this.shutdown();
  }

  private send(frame: object): void {
    try {
      this.socket.send(encodeFrame(frame));
    } catch {
      this.shutdown();
    }
  }

  private receive(data: Buffer): void {
    if (this.streams.receiveRaw(data)) return;
    let frame: unknown;
    try {
      frame = decodeFrame(data);
    } catch {
      return this.onProtocolError('undecodable frame');
    }
    if (isReplyFrame(frame)) {
      const call = this.pending.get(frame.id);
      if (!call) return; // A reply after its timeout: the caller has moved on.
      this.pending.delete(frame.id);
      clearTimeout(call.timer);
      if (frame.ok) call.resolve(frame.result);
      else call.reject(AgentFailure.from(frame.error));
      return;
    }
    if (isRequestFrame(frame)) {
      if (frame.type === STREAM_UP || frame.type === STREAM_DOWN) return this.streams.receiveFrame(frame);
      void this.dispatch(frame);
      return;
    }
    this.onProtocolError('frame is neither a request nor a reply');
  }

  private async dispatch(frame: RequestFrame): Promise<void> {
    const handler = this.handlers.get(frame.type);
    let upload: IncomingBytes | null = null;
    if (frame.upload && frame.id !== undefined) upload = this.streams.acceptUpload(frame.id);
    let reply: object;
    let ok = false;
    let body: AsyncIterable<Uint8Array> | null = null;
    try {
      if (!handler) throw new AgentFailure('unsupported', `unknown message type ${frame.type}`, false);
      let result = await handler(frame.payload, { upload });
      if (result instanceof WithDownload) {
        body = result.body;
        result = result.result;
      }
      reply = { v: WIRE_VERSION, id: frame.id, ok: true, result: result ?? {} };
      ok = true;
    } catch (err) {
      const error: AgentError =
        err instanceof AgentFailure
          ? err.toJSON()
          : { code: 'runtime_error', message: err instanceof Error ? err.message : String(err), retryable: false };
      reply = { v: WIRE_VERSION, id: frame.id, ok: false, error };
    } finally {
      // Bytes the handler did not read are dropped from here on.
      if (frame.id !== undefined) this.streams.endUpload(frame.id);
    }
    if (frame.id === undefined || this.closed) return;
    this.send(reply);
    if (frame.download && ok) void this.streams.pump(STREAM_DOWN, frame.id, body ?? emptySource());
  }

  private shutdown(): void {
    if (this.closed) return;
    this.closed = true;
    for (const [id, call] of this.pending) {
      clearTimeout(call.timer);
      call.reject(new AgentFailure('disconnected', 'agent link closed before the reply', true));
      this.pending.delete(id);
    }
    this.streams.closeAll();
    for (const listener of this.closeListeners.splice(0)) listener();
  }
}

async function* emptySource(): AsyncGenerator<Uint8Array> {}
