/**
 * A terminal client for tests, speaking the gateway's WebSocket terminal protocol
 * (shared/src/terminal-protocol.ts): it collects the output, waits for text in it, and records the
 * exit frame and the close code. Also a WebSocket RFB client (rfb2 over the socket as a stream).
 */
import WebSocket, { createWebSocketStream } from 'ws';
import { createConnection, type RfbClient } from 'rfb2';
import { until } from './scheduler.js';

export interface TerminalClient {
  readonly ws: WebSocket;
  /** Everything received in binary frames so far, as UTF-8. */
  output(): string;
  /** Resolves once the output (from `from` on) matches; fails after `timeoutMs`. */
  waitFor(pattern: RegExp, timeoutMs?: number, from?: number): Promise<RegExpMatchArray>;
  type(text: string): void;
  resize(cols: number, rows: number): void;
  /** The exit frame's code (null without one), the close code and reason. */
  readonly closed: Promise<{ exitCode: number | null; code: number; reason: string }>;
}

/** Opens a terminal WebSocket; resolves once it is open (a refused ticket still opens, then closes). */
export async function openTerminal(url: string): Promise<TerminalClient> {
  const ws = new WebSocket(url);
  let out = '';
  let exitCode: number | null = null;
  ws.on('message', (data, isBinary) => {
    const text = Buffer.isBuffer(data) ? data.toString('utf8') : Buffer.from(data as ArrayBuffer).toString('utf8');
    if (isBinary) out += text;
    else {
      const msg = JSON.parse(text) as { type: string; exit_code?: number };
      if (msg.type === 'exit') exitCode = msg.exit_code ?? null;
    }
  });
  const closed = new Promise<{ exitCode: number | null; code: number; reason: string }>((resolve) => {
    ws.once('close', (code, reason) => resolve({ exitCode, code, reason: reason.toString('utf8') }));
  });
  ws.on('error', () => undefined);
  await new Promise<void>((resolve, reject) => {
    ws.once('open', () => resolve());
    ws.once('error', reject);
  });
  return {
    ws,
    output: () => out,
    async waitFor(pattern, timeoutMs = 10_000, from = 0) {
      let match: RegExpMatchArray | null = null;
      try {
        await until(() => (match = out.slice(from).match(pattern)) !== null, timeoutMs, String(pattern));
      } catch {
        throw new Error(`timed out waiting for ${String(pattern)} in the terminal; it shows: ${JSON.stringify(out.slice(-500))}`);
      }
      return match as unknown as RegExpMatchArray;
    },
    type: (text) => ws.send(Buffer.from(text, 'utf8'), { binary: true }),
    resize: (cols, rows) => ws.send(JSON.stringify({ type: 'resize', cols, rows })),
    closed,
  };
}

/** An RFB client (rfb2) on a `ws://…/vnc?ticket=…` URL; resolves after the RFB handshake. */
export async function rfbOverWebSocket(url: string): Promise<{ ws: WebSocket; rfb: RfbClient; protocol: string }> {
  const ws = new WebSocket(url, ['binary']);
  ws.on('error', () => undefined);
  await new Promise<void>((resolve, reject) => {
    ws.once('open', () => resolve());
    ws.once('error', reject);
  });
  const stream = createWebSocketStream(ws);
  stream.on('error', () => undefined);
  const rfb = createConnection({ stream, encodings: [0, -223] });
  await new Promise<void>((resolve, reject) => {
    rfb.once('connect', resolve);
    rfb.once('error', reject);
    ws.once('close', (code, reason) => reject(new Error(`closed during the RFB handshake: ${code} ${reason.toString()}`)));
  });
  return { ws, rfb, protocol: ws.protocol };
}
