/**
 * One end of the agent link: request/reply over a websocket carrying msgpack frames. Both the
 * agent and the scheduler wrap their socket in an `RpcPeer`.
 *
 * Each outgoing request gets an id and its own timeout in a pending-call registry; when the socket
 * closes every pending call is rejected at once with a retryable `disconnected` failure, so no
 * caller waits for a reply that can no longer come.
 */
import { Packr } from 'msgpackr';
import type WebSocket from 'ws';
import {
  AgentFailure,
  WIRE_VERSION,
  isReplyFrame,
  isRequestFrame,
  type AgentError,
  type RequestFrame,
} from './protocol.js';

const packr = new Packr({ useRecords: false, mapsAsObjects: true });

export function encodeFrame(frame: object): Buffer {
  return packr.pack(frame);
}

export function decodeFrame(data: Buffer): unknown {
  return packr.unpack(data);
}

export type RequestHandler = (payload: unknown, type: string) => Promise<unknown>;

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

  constructor(
    private readonly socket: WebSocket,
    private readonly onProtocolError: (message: string) => void = () => {},
  ) {
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

  /** Handles incoming requests (and notifications) of `type`. */
  handle(type: string, handler: RequestHandler): void {
    this.handlers.set(type, handler);
  }

  onClose(listener: () => void): void {
    if (this.closed) listener();
    else this.closeListeners.push(listener);
  }

  request(type: string, payload: unknown, timeoutMs: number): Promise<unknown> {
    if (this.closed) {
      return Promise.reject(new AgentFailure('disconnected', 'agent link is closed', true));
    }
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new AgentFailure('timeout', `${type} timed out after ${timeoutMs} ms`, true));
      }, timeoutMs);
      this.pending.set(id, { resolve, reject, timer });
      this.send({ v: WIRE_VERSION, id, type, payload });
    });
  }

  notify(type: string, payload: unknown): void {
    if (!this.closed) this.send({ v: WIRE_VERSION, type, payload });
  }

  close(code = 1000, reason = ''): void {
    this.socket.close(code, reason);
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
      void this.dispatch(frame);
      return;
    }
    this.onProtocolError('frame is neither a request nor a reply');
  }

  private async dispatch(frame: RequestFrame): Promise<void> {
    const handler = this.handlers.get(frame.type);
    let reply: object;
    try {
      if (!handler) throw new AgentFailure('unsupported', `unknown message type ${frame.type}`, false);
      const result = await handler(frame.payload, frame.type);
      reply = { v: WIRE_VERSION, id: frame.id, ok: true, result: result ?? {} };
    } catch (err) {
      const error: AgentError =
        err instanceof AgentFailure
          ? err.toJSON()
          : { code: 'runtime_error', message: err instanceof Error ? err.message : String(err), retryable: false };
      reply = { v: WIRE_VERSION, id: frame.id, ok: false, error };
    }
    if (frame.id !== undefined && !this.closed) this.send(reply);
  }

  private shutdown(): void {
    if (this.closed) return;
    this.closed = true;
    for (const [id, call] of this.pending) {
      clearTimeout(call.timer);
      call.reject(new AgentFailure('disconnected', 'agent link closed before the reply', true));
      this.pending.delete(id);
    }
    for (const listener of this.closeListeners.splice(0)) listener();
  }
}
