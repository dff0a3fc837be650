/**
 * The stream gateway's WebSocket side over real sockets, with stand-ins for the runtime: a
 * terminal that echoes what is typed and reports its size, and a VNC "server" that greets and
 * echoes. Covers the terminal protocol (bytes both ways, keystrokes sent before the session is
 * open, resize, a bad control frame, the exit frame), refusals as close codes (reused, expired,
 * released, another generation, a host without terminals), RFB in binary frames with the control
 * claim held until the socket closes, and HTTP requests that are not upgrades.
 */
import { connect, type Socket } from 'node:net';
import { PassThrough } from 'node:stream';
import WebSocket from 'ws';
import { afterEach, describe, expect, it } from 'vitest';
import { AgentFailure } from '../../shared/src/protocol.js';
import { WS_CLOSE } from '../../shared/src/terminal-protocol.js';
import type { TerminalSession, TerminalSpec, VncSession } from '../../agent/src/runtime/driver.js';
import { StreamGateway, type StreamGatewayOptions } from '../../agent/src/stream/gateway.js';
import { FAIR_SHARE_FROM } from '../../agent/src/line-listener.js';
import { openTerminal } from '../helpers/terminal.js';
import { until } from '../helpers/scheduler.js';

/** Echoes input; `size?` answers the current size; `exit N` exits with N. */
class FakeTerminal implements TerminalSession {
  readonly exited: Promise<number>;
  closed = false;
  size: [number, number];
  private listener: (data: Buffer) => void = () => undefined;
  private finish!: (code: number) => void;

  constructor(spec: TerminalSpec) {
    this.size = [spec.cols, spec.rows];
    this.exited = new Promise((resolve) => (this.finish = resolve));
  }

  onData(listener: (data: Buffer) => void): void {
    this.listener = listener;
  }

  onDrain(): void {}

  write(data: Buffer): boolean {
    const text = data.toString('utf8');
    const exit = /^exit (\d+)\n$/.exec(text);
    if (exit) {
      this.listener(Buffer.from('bye\r\n'));
      this.finish(Number(exit[1]));
    } else if (text === 'size?\n') this.listener(Buffer.from(`${this.size[1]} ${this.size[0]}\r\n`));
    else this.listener(data);
    return true;
  }

  resize(cols: number, rows: number): void {
    this.size = [cols, rows];
  }

  pause(): void {}
  resume(): void {}

  close(): void {
    this.closed = true;
    this.finish(137);
  }
}

function vncStub(): VncSession {
  const input = new PassThrough();
  const output = new PassThrough();
  let done!: () => void;
  const closed = new Promise<void>((resolve) => (done = resolve));
  output.write('RFB 003.008\n');
  input.on('data', (chunk: Buffer) => output.write(chunk));
  return { input, output, closed, close: () => (output.end(), done()) };
}

/** Sends raw bytes and resolves with everything the gateway answered before closing. */
async function rawHttp(port: number, request: string, from?: string): Promise<string> {
  const socket = connect({ host: '127.0.0.1', port, localAddress: from });
  let text = '';
  socket.on('data', (chunk: Buffer) => (text += chunk.toString('latin1')));
  socket.on('error', () => undefined);
  socket.write(request);
  await new Promise((resolve) => socket.once('close', resolve));
  return text;
}

describe('stream gateway WebSockets', () => {
  let gateway: StreamGateway | null = null;
  const terminals: FakeTerminal[] = [];
  let generation = 4;
  let openDelayMs = 0;

  async function start(options: Partial<StreamGatewayOptions> = {}): Promise<StreamGateway> {
    terminals.length = 0;
    generation = 4;
    gateway = await StreamGateway.start({
      listenHost: '127.0.0.1',
      port: 0,
      advertiseHost: '127.0.0.1',
      open: async () => vncStub(),
      openTerminal: async (_desktopId, spec) => {
        if (openDelayMs > 0) await new Promise((r) => setTimeout(r, openDelayMs));
        const terminal = new FakeTerminal(spec);
        terminals.push(terminal);
        return terminal;
      },
      generationOf: () => generation,
      log: () => undefined,
      ...options,
    });
    return gateway;
  }

  const url = (gw: StreamGateway, spec: Partial<TerminalSpec> = {}) =>
    `ws://127.0.0.1:${gw.port}/terminal?ticket=${gw.grantTerminal('dsk_a', 4, { cols: 80, rows: 24, command: null, ...spec }).ticket}`;

  afterEach(async () => {
    openDelayMs = 0;
    await gateway?.close();
    gateway = null;
  });

  it('relays a terminal both ways, keeps keystrokes sent before it is open, resizes, and ends with the exit frame', async () => {
    const gw = await start();
    openDelayMs = 100;
    const term = await openTerminal(url(gw, { cols: 100, rows: 30 }));
    term.type('typed-early\n');
    await term.waitFor(/typed-early\n/);
    term.type('size?\n');
    await term.waitFor(/30 100\r\n/);
    term.resize(132, 43);
    term.type('size?\n');
    await term.waitFor(/43 132\r\n/);
    term.type('exit 5\n');
    expect(await term.closed).toEqual({ exitCode: 5, code: WS_CLOSE.done, reason: 'done' });
    expect(term.output()).toMatch(/bye\r\n$/);
  });

  it('closes on a text frame that is not a control message, and ends the terminal with the socket', async () => {
    const gw = await start();
    const bad = await openTerminal(url(gw));
    await until(() => terminals.length === 1, 5_000, 'the terminal');
    bad.ws.send(JSON.stringify({ type: 'resize', cols: 0, rows: 10 }));
    expect((await bad.closed).code).toBe(WS_CLOSE.bad_frame);
    await until(() => terminals[0]?.closed === true, 5_000, 'the terminal to be closed');

    const left = await openTerminal(url(gw));
    await until(() => terminals.length === 2, 5_000, 'the second terminal');
    left.ws.close();
    await until(() => terminals[1]?.closed === true, 5_000, 'the terminal to end with its socket');
  });

  it('refuses reused, expired, released and other-generation tickets with close codes', async () => {
    const gw = await start({ ticketTtlMs: 200 });
    const once = url(gw);
    const first = await openTerminal(once);
    expect((await (await openTerminal(once)).closed).code).toBe(WS_CLOSE.invalid_ticket);
    first.ws.close();

    const late = url(gw);
    await new Promise((r) => setTimeout(r, 300));
    expect(await (await openTerminal(late)).closed).toMatchObject({ code: WS_CLOSE.expired_ticket, reason: 'expired_ticket' });

    const released = url(gw);
    gw.release('dsk_a');
    expect((await (await openTerminal(released)).closed).code).toBe(WS_CLOSE.not_running);

    const stale = url(gw);
    generation = 5;
    expect((await (await openTerminal(stale)).closed).code).toBe(WS_CLOSE.not_running);
    expect(terminals).toHaveLength(1);
  });

  it('closes with 4503 when the terminal cannot start, and 1001 when the desktop stops', async () => {
    const gw = await start();
    const open = await openTerminal(url(gw));
    await until(() => terminals.length === 1, 5_000, 'the terminal');
    gw.release('dsk_a');
    expect((await open.closed).code).toBe(WS_CLOSE.going_away);
    await gw.close();

    gateway = await StreamGateway.start({
      listenHost: '127.0.0.1', port: 0, advertiseHost: '127.0.0.1', open: async () => vncStub(), log: () => undefined,
      openTerminal: async () => {
        throw new AgentFailure('unsupported', 'no pty here', false);
      },
    });
    const refused = await openTerminal(url(gateway));
    expect(await refused.closed).toMatchObject({ code: WS_CLOSE.unavailable, reason: 'unavailable' });
    expect(() => gateway!.grantTerminal('dsk_a', 1, { cols: 80, rows: 24, command: null })).not.toThrow();
  });

  it('carries RFB in binary frames with subprotocol binary, holding the control claim until the socket closes', async () => {
    const gw = await start();
    const grant = gw.grant('dsk_a', 'control');
    const ws = new WebSocket(`ws://127.0.0.1:${gw.port}/vnc?ticket=${grant.ticket}`, ['binary']);
    let received = '';
    ws.on('message', (data, isBinary) => {
      expect(isBinary).toBe(true);
      received += (data as Buffer).toString('latin1');
    });
    await new Promise((resolve) => ws.once('open', resolve));
    expect(ws.protocol).toBe('binary');
    ws.send(Buffer.from('RFB 003.008\n'));
    await until(() => received === 'RFB 003.008\nRFB 003.008\n', 5_000, 'the greeting and the echo');
    expect(gw.controlHeld('dsk_a')).toBe(true);
    ws.close();
    await until(() => !gw.controlHeld('dsk_a'), 5_000, 'the claim to be released');
  });

  it('answers HTTP requests that are not WebSocket upgrades, and still takes raw ticket lines', async () => {
    const gw = await start();
    expect(await rawHttp(gw.port, 'GET /elsewhere HTTP/1.1\r\nHost: x\r\n\r\n')).toMatch(/^HTTP\/1\.1 404 /);
    expect(await rawHttp(gw.port, 'GET /terminal?ticket=x HTTP/1.1\r\nHost: x\r\n\r\n')).toMatch(/^HTTP\/1\.1 400 /);
    expect(await rawHttp(gw.port, 'GET nonsense\r\n\r\n')).toMatch(/^HTTP\/1\.1 400 /);
    expect(await rawHttp(gw.port, `GET /vnc HTTP/1.1\r\nX: ${'a'.repeat(9000)}\r\n\r\n`)).toMatch(/^HTTP\/1\.1 431 /);
    const socket = connect({ host: '127.0.0.1', port: gw.port });
    let greeting = '';
    socket.on('data', (chunk: Buffer) => (greeting += chunk.toString('latin1')));
    socket.write(`${gw.grant('dsk_a', 'view').ticket}\n`);
    await until(() => greeting === 'RFB 003.008\n', 5_000, 'the raw form to greet');
    socket.destroy();
  });

  it('caps request heads one address leaves unfinished once half the slots are taken, and serves other addresses', async () => {
    const gw = await start();
    const held: Socket[] = [];
    const open = (from: string) =>
      new Promise<boolean>((resolve) => {
        const socket = connect({ host: '127.0.0.1', port: gw.port, localAddress: from });
        held.push(socket);
        socket.on('error', () => undefined);
        // The first line, then silence: the head is never finished.
        socket.once('connect', () => socket.write('GET /vnc HTTP/1.1\r\n'));
        // Long enough for the gateway to get to every one of hundreds of connections.
        const timer = setTimeout(() => resolve(true), 2_000);
        socket.once('close', () => {
          clearTimeout(timer);
          resolve(false);
        });
      });
    const kept = await Promise.all(Array.from({ length: FAIR_SHARE_FROM + 8 }, () => open('127.0.0.1')));
    expect(kept.filter(Boolean)).toHaveLength(FAIR_SHARE_FROM);
    expect(await rawHttp(gw.port, 'GET /elsewhere HTTP/1.1\r\n\r\n', '127.0.1.2')).toMatch(/^HTTP\/1\.1 404 /);
    for (const socket of held) socket.destroy();
  });
});

