/**
 * `canto terminal`: attaches this terminal to a desktop's terminal WebSocket (the url from
 * POST /v1/desktops/{id}/terminals). Standard input goes out in binary frames, the desktop's output
 * comes back to standard output. On a tty, input is raw (keys such as Ctrl-C go to the desktop,
 * not to this process) and window size changes are sent as resize messages. The process exits with
 * the desktop program's exit status, or 1 when the session ends without one.
 */
import WebSocket from 'ws';
import { TERMINAL_SIZE, WS_CLOSE, type TerminalExit } from '../../shared/src/terminal-protocol.js';

export interface TerminalStdio {
  readonly stdin: NodeJS.ReadStream;
  readonly stdout: NodeJS.WriteStream;
  readonly stderr: NodeJS.WriteStream;
}

/** Checks the url's form; throws a message naming what is wrong. */
export function parseTerminalUrl(value: string): URL {
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    throw new Error(`not a URL: ${value}`);
  }
  if ((url.protocol !== 'ws:' && url.protocol !== 'wss:') || url.pathname !== '/terminal' || !url.searchParams.get('ticket')) {
    throw new Error('expected ws://host:port/terminal?ticket=…, as POST /v1/desktops/{id}/terminals returns');
  }
  return url;
}

const clamp = (n: number, lo: number, hi: number) => Math.min(hi, Math.max(lo, n));

/** Runs the session; resolves with the exit status to exit with. */
export async function attachTerminal(url: URL, io: TerminalStdio): Promise<number> {
  const ws = new WebSocket(url);
  const tty = io.stdin.isTTY === true && io.stdout.isTTY === true;
  let exitCode: number | null = null;
  const sendSize = () => {
    const cols = clamp(io.stdout.columns ?? TERMINAL_SIZE.defaultCols, TERMINAL_SIZE.minCols, TERMINAL_SIZE.maxCols);
    const rows = clamp(io.stdout.rows ?? TERMINAL_SIZE.defaultRows, TERMINAL_SIZE.minRows, TERMINAL_SIZE.maxRows);
    ws.send(JSON.stringify({ type: 'resize', cols, rows }));
  };
  const onInput = (chunk: Buffer) => ws.send(chunk, { binary: true });
  const closed = new Promise<{ code: number; reason: string }>((resolve, reject) => {
    ws.once('error', reject);
    ws.once('close', (code, reason) => resolve({ code, reason: reason.toString('utf8') }));
  });
  ws.on('message', (data, isBinary) => {
    const bytes = Array.isArray(data) ? Buffer.concat(data) : Buffer.from(data as Buffer);
    if (isBinary) {
      io.stdout.write(bytes);
      return;
    }
    const msg = JSON.parse(bytes.toString('utf8')) as Partial<TerminalExit>;
    if (msg.type === 'exit' && typeof msg.exit_code === 'number') exitCode = msg.exit_code;
  });
  ws.once('open', () => {
    if (tty) {
      io.stdin.setRawMode(true);
      sendSize();
      io.stdout.on('resize', sendSize);
    }
    io.stdin.on('data', onInput);
    // Piped input that ends is an end of input at the terminal, as Ctrl-D is.
    if (!tty) io.stdin.once('end', () => ws.readyState === ws.OPEN && ws.send(Buffer.from([4]), { binary: true }));
    io.stdin.resume();
  });
  try {
    const { code, reason } = await closed;
    if (exitCode !== null) return exitCode;
    if (code !== WS_CLOSE.done && code !== 1005) io.stderr.write(`\r\n${closeMessage(code, reason)}\r\n`);
    return 1;
  } finally {
    io.stdin.off('data', onInput);
    io.stdout.off('resize', sendSize);
    if (tty) io.stdin.setRawMode(false);
    // An open stdin would keep the process alive after the session.
    io.stdin.destroy();
  }
}

/** What a closed terminal tells its user: what happened, in words, and what to do next. */
export function closeMessage(code: number, reason: string): string {
  switch (code) {
    case WS_CLOSE.going_away:
      return 'The terminal ended: the desktop stopped (hibernated, moved to another host or destroyed) or its host is restarting. Open a new terminal once it is awake.';
    case WS_CLOSE.invalid_ticket:
    case WS_CLOSE.expired_ticket:
      return 'The terminal URL is not valid (used already, or expired): ask for a new one with POST /v1/desktops/{id}/terminals.';
    case WS_CLOSE.not_running:
      return 'The desktop is not running on that host: wake it and ask for a new terminal.';
    case WS_CLOSE.unavailable:
      return `The terminal could not be started: ${reason || 'the host cannot make terminals'}.`;
    default:
      return `The terminal closed: ${code} ${reason}`;
  }
}
