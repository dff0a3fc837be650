/**
 * Terminal and browser-stream benchmarks through the API's tickets (scheduler → agent link →
 * stream gateway → the desktop):
 * - terminal keystroke round trip: one byte sent in a binary frame until the shell's echo comes
 *   back over the WebSocket, against the same on a local pty (node-pty running bash on the host,
 *   no WebSocket, no namespaces): what a pty and a shell cost here by themselves;
 * - screen frames per second through the WebSocket stream (`ws_url`): full, non-incremental
 *   1024x768 raw framebuffer updates back to back with rfb2, against the raw TCP form of the same
 *   ticket (`url`), which relays the same x11vnc without WebSocket framing;
 * - a hibernate with a terminal open, against the same desktop's hibernate without one (the
 *   terminal's processes must be gone, and reaped, before the dump can finish).
 */
import { connect } from 'node:net';
import { createConnection, type RfbClient } from 'rfb2';
import { openTerminal, rfbOverWebSocket } from '../helpers/terminal.js';
import { median, percentile, table, timed } from './stats.js';

export interface TerminalBenchContext {
  readonly schedulerUrl: string;
  readonly apiKey: string;
  readonly runs: number;
}

const KEYSTROKES = 200;
const FRAME_SECONDS = 5;

/** Round trips of single keystrokes: each waits for its echo before the next is sent. */
async function keystrokes(send: (byte: string) => void, received: () => number, count: number): Promise<number[]> {
  const ms: number[] = [];
  for (let i = 0; i < count; i++) {
    // Type a letter and erase it again (a backspace echoes too), so the line never grows.
    const key = i % 2 === 0 ? 'x' : '\x7f';
    const before = received();
    ms.push(await timed(async () => {
      send(key);
      while (received() === before) await new Promise<void>((r) => setImmediate(r));
    }));
  }
  return ms;
}

/** A login shell on a local pty: the baseline. */
async function localPtyRoundTrips(count: number): Promise<number[]> {
  const pty = await import('@lydell/node-pty');
  const term = pty.spawn('/bin/bash', ['--norc', '-i'], { name: 'xterm-256color', cols: 80, rows: 24, env: { PATH: process.env.PATH ?? '/usr/bin:/bin', TERM: 'xterm-256color', PS1: '$ ' } });
  let bytes = 0;
  term.onData((d) => (bytes += d.length));
  try {
    await new Promise((r) => setTimeout(r, 500)); // the prompt
    return await keystrokes((key) => term.write(key), () => bytes, count);
  } finally {
    term.kill('SIGKILL');
  }
}

/** Full frames per second over `seconds`. */
async function framesPerSecond(rfb: RfbClient, seconds: number): Promise<number> {
  const full = rfb.width * rfb.height;
  let area = 0;
  let frames = 0;
  const ask = () => rfb.requestUpdate(false, 0, 0, rfb.width, rfb.height);
  const t0 = performance.now();
  await new Promise<void>((resolve) => {
    rfb.on('rect', (rect) => {
      area += rect.width * rect.height;
      if (area < full) return;
      area = 0;
      frames++;
      if (performance.now() - t0 >= seconds * 1000) resolve();
      else ask();
    });
    ask();
  });
  return frames / ((performance.now() - t0) / 1000);
}

/** rfb2 on the raw TCP form of a stream ticket. */
async function rfbOverTcp(url: string): Promise<RfbClient> {
  const target = new URL(url);
  const socket = connect({ host: target.hostname, port: Number(target.port), noDelay: true });
  await new Promise<void>((resolve, reject) => {
    socket.once('connect', resolve);
    socket.once('error', reject);
  });
  socket.write(`${target.searchParams.get('ticket')}\n`);
  const rfb = createConnection({ stream: socket, encodings: [0] });
  await new Promise<void>((resolve, reject) => {
    rfb.once('connect', resolve);
    rfb.once('error', reject);
  });
  return rfb;
}

export async function benchTerminal(ctx: TerminalBenchContext): Promise<void> {
  const call = async (path: string, body: unknown = {}) => {
    const res = await fetch(ctx.schedulerUrl + path, {
      method: 'POST',
      headers: { authorization: `Bearer ${ctx.apiKey}`, 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
    const json = (await res.json()) as Record<string, string>;
    if (res.status >= 300) throw new Error(`${path}: ${res.status} ${JSON.stringify(json)}`);
    return json;
  };
  const id = (await call('/v1/desktops', { tier: 'default' })).id as string;
  await call(`/v1/desktops/${id}/wake?wait=true`);
  try {
    const rows: Array<[string, number, number, string, string]> = [];
    const term = await openTerminal((await call(`/v1/desktops/${id}/terminals`)).url as string);
    await term.waitFor(/[#$] $/);
    let received = 0;
    term.ws.on('message', (data, isBinary) => {
      if (isBinary) received += (data as Buffer).length;
    });
    const through = await keystrokes((key) => term.type(key), () => received, KEYSTROKES);
    term.ws.close();
    const local = await localPtyRoundTrips(KEYSTROKES);
    rows.push([`terminal keystroke round trip (p99 ${percentile(through, 99).toFixed(1)} ms)`, median(through), median(local), 'ms', '< 10 ms p50']);
    process.stderr.write('terminal keystrokes done\r');

    const fps: number[] = [];
    const fpsRaw: number[] = [];
    for (let i = 0; i < Math.max(2, Math.round(ctx.runs / 4)); i++) {
      const ws = await rfbOverWebSocket((await call(`/v1/desktops/${id}/stream`, { claim: 'view' })).ws_url as string);
      fps.push(await framesPerSecond(ws.rfb, FRAME_SECONDS));
      ws.ws.close();
      const raw = await rfbOverTcp((await call(`/v1/desktops/${id}/stream`, { claim: 'view' })).url as string);
      fpsRaw.push(await framesPerSecond(raw, FRAME_SECONDS));
      raw.end();
    }
    rows.push(['screen frames per second through the WebSocket stream (1024x768 raw, full updates)', median(fps), median(fpsRaw), 'fps', '']);

    // A hibernate ends every terminal first; the baseline is the same desktop's hibernate with none.
    const withTerminal: number[] = [];
    const without: number[] = [];
    for (let i = 0; i < Math.max(3, Math.min(ctx.runs, 5)); i++) {
      without.push(await timed(() => call(`/v1/desktops/${id}/hibernate?wait=true`)));
      await call(`/v1/desktops/${id}/wake?wait=true`);
      const open = await openTerminal((await call(`/v1/desktops/${id}/terminals`)).url as string);
      await open.waitFor(/[#$] $/);
      withTerminal.push(await timed(() => call(`/v1/desktops/${id}/hibernate?wait=true`)));
      open.ws.close();
      await call(`/v1/desktops/${id}/wake?wait=true`);
    }
    rows.push(['hibernate with a terminal open (baseline: without)', median(withTerminal), median(without), 'ms', '']);
    table(
      `Terminals and the browser stream (${KEYSTROKES} keystrokes; ${FRAME_SECONDS} s of frames per run); baseline = a local pty running bash, or the raw TCP stream`,
      rows,
    );
  } finally {
    await call(`/v1/desktops/${id}/destroy?wait=true`).catch(() => undefined);
  }
}
