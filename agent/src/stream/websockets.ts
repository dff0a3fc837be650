/**
 * The stream gateway's WebSocket side (the protocol is in shared/src/terminal-protocol.ts).
 *
 * A browser cannot send a raw ticket line, so the gateway also takes an HTTP upgrade on the same
 * port: a first line `GET /vnc?…` or `GET /terminal?…` makes it read the rest of the request head
 * here, with a size limit and a deadline, and hand the socket to `ws` for the handshake. Only the
 * path and the ticket matter; there are no cookies, so the Origin header is not checked: the
 * single-use ticket in the URL is the whole credential.
 *
 * The relays apply backpressure: a VNC server's or a terminal's output is paused while too much of
 * it waits in the socket, and a terminal's client is not read while the program leaves too much
 * of its input unread. What a VNC client sends is written on as it comes (x11vnc reads it all).
 */
import type { Socket } from 'node:net';
import { WebSocketServer, type RawData, type ServerOptions, type WebSocket } from 'ws';
import { LINGER_MS } from '../line-listener.js';
import { TypeCompiler } from '@sinclair/typebox/compiler';
import { TerminalResize, WS_CLOSE, type TerminalExit, type WsCloseReason } from '../../../shared/src/terminal-protocol.js';
import type { TerminalSession, VncSession } from '../runtime/driver.js';

export interface HttpHead {
  readonly method: string;
  /** The path, without the query. */
  readonly path: string;
  readonly query: URLSearchParams;
  /** Lower-case names; repeated headers joined with `, `. */
  readonly headers: Record<string, string>;
}

const MAX_HEAD_BYTES = 8 * 1024;
/** Output waiting in a socket above which its source is paused, and below which it resumes. */
const HIGH_WATER = 1024 * 1024;
const LOW_WATER = 256 * 1024;
/** The largest frame a client may send (RFB input and keystrokes are small). */
const MAX_PAYLOAD = 1024 * 1024;
const CRLF2 = Buffer.from('\r\n\r\n');
const REQUEST_LINE = /^GET (\/[^\s?#]*)(\?[^\s#]*)? HTTP\/1\.1$/;

const resizeCheck = TypeCompiler.Compile(TerminalResize);

/** True when the gateway's first line is the start of an HTTP request rather than a ticket. */
export function isHttpRequestLine(line: string): boolean {
  return line.startsWith('GET ');
}

/**
 * Reads the rest of the request head after its first line; null (the socket answered or
 * destroyed) when it is malformed, too long, or not complete in time.
 */
export function readHttpHead(socket: Socket, line: string, early: Buffer, timeoutMs: number): Promise<{ head: HttpHead; rest: Buffer } | null> {
  return new Promise((resolve) => {
    const match = REQUEST_LINE.exec(line);
    if (match === null) {
      answerHttp(socket, 400, 'Bad Request');
      resolve(null);
      return;
    }
    // The request line's CRLF is consumed: put it back so an empty header block is found too.
    let buf: Buffer = Buffer.concat([Buffer.from('\r\n'), early]);
    const timer = setTimeout(() => finish(null), timeoutMs);
    timer.unref();
    const finish = (result: { head: HttpHead; rest: Buffer } | null) => {
      clearTimeout(timer);
      socket.off('data', onData);
      socket.off('close', onClose);
      socket.pause();
      if (result === null && !socket.destroyed) socket.destroy();
      resolve(result);
    };
    const onClose = () => finish(null);
    const onData = (chunk: Buffer) => {
      buf = buf.length === 0 ? chunk : Buffer.concat([buf, chunk]);
      check();
    };
    const check = () => {
      const end = buf.indexOf(CRLF2);
      if (end < 0 ? buf.length > MAX_HEAD_BYTES : end > MAX_HEAD_BYTES) {
        answerHttp(socket, 431, 'Request Header Fields Too Large');
        finish(null);
        return;
      }
      if (end < 0) return;
      const headers: Record<string, string> = {};
      for (const raw of buf.subarray(2, end).toString('latin1').split('\r\n')) {
        const colon = raw.indexOf(':');
        if (raw === '') continue;
        if (colon <= 0) {
          answerHttp(socket, 400, 'Bad Request');
          finish(null);
          return;
        }
        const name = raw.slice(0, colon).trim().toLowerCase();
        const value = raw.slice(colon + 1).trim();
        headers[name] = headers[name] === undefined ? value : `${headers[name]}, ${value}`;
      }
      const head: HttpHead = { method: 'GET', path: match[1] ?? '/', query: new URLSearchParams(match[2] ?? ''), headers };
      finish({ head, rest: buf.subarray(end + 4) });
    };
    socket.on('data', onData);
    socket.once('close', onClose);
    check();
    if (!socket.destroyed) socket.resume();
  });
}

/** Answers a request that will not be upgraded, and closes. */
export function answerHttp(socket: Socket, status: number, text: string): void {
  if (socket.destroyed) return;
  socket.end(`HTTP/1.1 ${status} ${text}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n`);
  const timer = setTimeout(() => socket.destroy(), 2_000);
  timer.unref();
  socket.once('close', () => clearTimeout(timer));
}

/** The handshakes: no compression (terminal and RFB bytes are small or already encoded). */
export function webSocketServer(): WebSocketServer {
  // `closeTimeout` is ws's own (8.19 and later); its type declarations do not know it yet.
  const options: ServerOptions & { closeTimeout: number } = {
    noServer: true,
    perMessageDeflate: false,
    maxPayload: MAX_PAYLOAD,
    clientTracking: false,
    // A client that never answers our close frame is cut off after the linger, not ws's 30 s.
    closeTimeout: LINGER_MS,
    // noVNC offers `binary`; an older client may offer `base64`, which is not served.
    handleProtocols: (offered) => (offered.has('binary') ? 'binary' : false),
  };
  return new WebSocketServer(options);
}

/** Completes the upgrade; null when the request is not a valid WebSocket handshake (answered by ws). */
export function upgrade(wss: WebSocketServer, socket: Socket, head: HttpHead, rest: Buffer): Promise<WebSocket | null> {
  return new Promise((resolve) => {
    const req = { method: head.method, url: head.path, headers: head.headers };
    socket.once('close', () => resolve(null));
    // `ws` reads only the method, url and headers of the request it is given.
    wss.handleUpgrade(req as never, socket, rest, (ws) => {
      socket.resume();
      resolve(ws);
    });
  });
}

/** Closes with a gateway close code, its name as the reason. */
export function closeWith(ws: WebSocket, reason: WsCloseReason): void {
  // A paused socket would never read the client's answering close frame.
  if (ws.isPaused) ws.resume();
  if (ws.readyState === ws.OPEN || ws.readyState === ws.CONNECTING) ws.close(WS_CLOSE[reason], reason);
}

function bytesOf(data: RawData): Buffer {
  if (Array.isArray(data)) return Buffer.concat(data);
  return Buffer.isBuffer(data) ? data : Buffer.from(data);
}

/** Sends output with backpressure: `pause` when too much waits in the socket, `resume` once it drained. */
function sender(ws: WebSocket, pause: () => void, resume: () => void): (data: Buffer) => void {
  let waiting = 0;
  let paused = false;
  return (data) => {
    if (ws.readyState !== ws.OPEN) return;
    waiting += data.length;
    ws.send(data, { binary: true }, () => {
      waiting -= data.length;
      if (paused && waiting < LOW_WATER) {
        paused = false;
        resume();
      }
    });
    if (!paused && waiting > HIGH_WATER) {
      paused = true;
      pause();
    }
  };
}

/** Relays a terminal over a WebSocket until either ends; the session is closed when the socket is. */
export function relayTerminal(ws: WebSocket, session: TerminalSession): void {
  session.onData(sender(ws, () => session.pause(), () => session.resume()));
  // Typed bytes the program does not read stop the reading of the socket until it catches up.
  session.onDrain(() => {
    if (ws.isPaused && ws.readyState === ws.OPEN) ws.resume();
  });
  ws.on('message', (data, isBinary) => {
    if (isBinary) {
      if (!session.write(bytesOf(data))) ws.pause();
      return;
    }
    let msg: unknown;
    try {
      msg = JSON.parse(bytesOf(data).toString('utf8'));
    } catch {
      msg = null;
    }
    if (!resizeCheck.Check(msg)) {
      closeWith(ws, 'bad_frame');
      return;
    }
    session.resize(msg.cols, msg.rows);
  });
  ws.once('close', () => session.close());
  ws.resume();
  void session.exited.then((code) => {
    if (ws.readyState !== ws.OPEN) return;
    const exit: TerminalExit = { type: 'exit', exit_code: code };
    ws.send(JSON.stringify(exit));
    closeWith(ws, 'done');
  });
}

/** Relays RFB between a WebSocket and a VNC server until either ends. */
export function relayVnc(ws: WebSocket, session: VncSession): void {
  const output = session.output;
  output.on('data', sender(ws, () => output.pause(), () => output.resume()));
  output.on('error', () => ws.terminate());
  session.input.on('error', () => ws.terminate());
  // What the VNC server has not read stops the reading of the socket until it catches up: a
  // client that sends without reading would otherwise grow the agent's memory without bound.
  session.input.on('drain', () => {
    if (ws.isPaused && ws.readyState === ws.OPEN) ws.resume();
  });
  ws.on('message', (data) => {
    if (!session.input.write(bytesOf(data))) ws.pause();
  });
  ws.once('close', () => session.close());
  ws.resume();
  void session.closed.then(() => closeWith(ws, 'done'));
}
