/**
 * The stream gateway over real sockets, with an in-process VNC server: a fake `open` whose
 * session greets with `RFB 003.008\n` and echoes what it receives. Covers the ticket handshake
 * (good, reused, expired, garbage, silent, too long), the relay both ways, and the claims: one
 * control claim per desktop, released when its connection closes, when its unused ticket expires,
 * and by `release`.
 */
import { connect, type Socket } from 'node:net';
import { PassThrough } from 'node:stream';
import { afterEach, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { AgentFailure } from '../../shared/src/protocol.js';
import type { VncSession } from '../../agent/src/runtime/driver.js';
import { StreamGateway, type StreamGatewayOptions } from '../../agent/src/stream/gateway.js';
import { MAX_VIEW_CLAIMS } from '../../agent/src/stream/tickets.js';
import { until } from '../helpers/wait.js';

const GREETING = 'RFB 003.008\n';

/** A VNC "server" in the test process: greets, then echoes. */
class FakeServer implements VncSession {
  readonly input = new PassThrough();
  readonly output = new PassThrough();
  readonly closed: Promise<void>;
  received = '';
  private done!: () => void;

  constructor(readonly desktopId: string, readonly viewOnly: boolean) {
    this.closed = new Promise((resolve) => (this.done = resolve));
    this.output.write(GREETING);
    this.input.on('data', (chunk: Buffer) => {
      this.received += chunk.toString('latin1');
      this.output.write(chunk);
    });
    this.input.on('end', () => this.exit());
  }

  /** The server exits on its own. */
  exit(): void {
    if (!this.output.writableEnded) this.output.end();
    this.done();
  }

  close(): void {
    this.exit();
  }
}

/** A client connection that records everything it receives. */
class Client {
  data = '';
  readonly ended: Promise<void>;

  private constructor(readonly socket: Socket) {
    socket.on('data', (chunk: Buffer) => (this.data += chunk.toString('latin1')));
    socket.on('error', () => undefined);
    this.ended = new Promise((resolve) => socket.once('close', () => resolve()));
  }

  static async dial(port: number, line?: string): Promise<Client> {
    const socket = connect({ host: '127.0.0.1', port });
    await new Promise<void>((resolve, reject) => {
      socket.once('connect', resolve);
      socket.once('error', reject);
    });
    const client = new Client(socket);
    if (line !== undefined) socket.write(line);
    return client;
  }

  async waitFor(text: string): Promise<void> {
    await until(() => this.data.includes(text), 5_000, `client to receive ${JSON.stringify(text)}`);
  }

  /** Resolves with everything received once the gateway has closed the connection. */
  async closedWith(): Promise<string> {
    await this.ended;
    return this.data;
  }
}

describe('stream gateway', () => {
  let gateway: StreamGateway | null = null;
  let servers: FakeServer[] = [];
  let openFailure: Error | null = null;
  const logs: Array<{ msg: string; fields?: object }> = [];

  async function start(options: Partial<StreamGatewayOptions> = {}): Promise<StreamGateway> {
    servers = [];
    openFailure = null;
    logs.length = 0;
    gateway = await StreamGateway.start({
      listenHost: '127.0.0.1',
      port: 0,
      advertiseHost: 'agent.test',
      open: async (desktopId, viewOnly) => {
        if (openFailure !== null) throw openFailure;
        const server = new FakeServer(desktopId, viewOnly);
        servers.push(server);
        return server;
      },
      log: (msg, fields) => logs.push({ msg, fields }),
      ...options,
    });
    return gateway;
  }

  afterEach(async () => {
    await gateway?.close();
    gateway = null;
  });

  it('relays both ways after a good ticket, starting with the RFB greeting', async () => {
    const gw = await start();
    const grant = gw.grant('dsk_a', 'view');
    expect(grant.ticket).toMatch(/^stk_[A-Za-z0-9_-]{43}$/);
    expect(grant.host).toBe('agent.test');
    expect(grant.port).toBe(gw.port);
    expect(grant.expiresAt.getTime()).toBeGreaterThan(Date.now() + 50_000);

    // The first RFB bytes ride in the same packet as the ticket line.
    const client = await Client.dial(gw.port, `${grant.ticket}\nRFB 003.008\n`);
    await client.waitFor(GREETING);
    expect(client.data.startsWith(GREETING)).toBe(true);
    expect(servers).toHaveLength(1);
    expect(servers[0]).toMatchObject({ desktopId: 'dsk_a', viewOnly: true });
    client.socket.write('ping');
    await client.waitFor('ping');
    expect(servers[0]?.received).toBe('RFB 003.008\nping');
    expect(client.data).toBe(`${GREETING}RFB 003.008\nping`);

    // The client hangs up: the server sees the end of its input.
    client.socket.end();
    await servers[0]?.closed;
    await client.ended;
    // No log line carries the ticket.
    expect(JSON.stringify(logs)).not.toContain(grant.ticket);
    expect(logs.map((l) => l.msg)).toContain('stream session ended');
  });

  it('accepts a CRLF line and opens a control session with input', async () => {
    const gw = await start();
    const client = await Client.dial(gw.port, `${gw.grant('dsk_a', 'control').ticket}\r\n`);
    await client.waitFor(GREETING);
    expect(servers[0]?.viewOnly).toBe(false);
    client.socket.destroy();
  });

  it('refuses a reused ticket', async () => {
    const gw = await start();
    const { ticket } = gw.grant('dsk_a', 'view');
    const first = await Client.dial(gw.port, `${ticket}\n`);
    await first.waitFor(GREETING);
    const second = await Client.dial(gw.port, `${ticket}\n`);
    expect(await second.closedWith()).toBe('ERR invalid_ticket\n');
    // Also after the first connection is gone.
    first.socket.destroy();
    await first.ended;
    const third = await Client.dial(gw.port, `${ticket}\n`);
    expect(await third.closedWith()).toBe('ERR invalid_ticket\n');
    expect(servers).toHaveLength(1);
  });

  it('refuses an expired ticket', async () => {
    const gw = await start({ ticketTtlMs: 50 });
    const grant = gw.grant('dsk_a', 'view');
    await until(() => Date.now() > grant.expiresAt.getTime() + 5, 5_000, 'the ticket to expire');
    const client = await Client.dial(gw.port, `${grant.ticket}\n`);
    expect(await client.closedWith()).toBe('ERR expired_ticket\n');
    expect(servers).toHaveLength(0);
  });

  it('refuses garbage, an over-long line, and closes on a client that never sends a line', async () => {
    const gw = await start({ handshakeTimeoutMs: 100 });
    gw.grant('dsk_a', 'view');
    const garbage = await Client.dial(gw.port, 'hello\n');
    expect(await garbage.closedWith()).toBe('ERR invalid_ticket\n');
    // A well-formed ticket nobody issued.
    const unknown = await Client.dial(gw.port, `stk_${'A'.repeat(43)}\n`);
    expect(await unknown.closedWith()).toBe('ERR invalid_ticket\n');
    const long = await Client.dial(gw.port, 'x'.repeat(300));
    expect(await long.closedWith()).toBe('ERR invalid_ticket\n');
    // A line of 256 bytes or more, even with its newline, is too long.
    const exactly = await Client.dial(gw.port, `${'x'.repeat(256)}\n`);
    expect(await exactly.closedWith()).toBe('ERR invalid_ticket\n');
    const silent = await Client.dial(gw.port, 'stk_no_newline_yet');
    expect(await silent.closedWith()).toBe('');
    const mute = await Client.dial(gw.port);
    expect(await mute.closedWith()).toBe('');
    expect(servers).toHaveLength(0);
  });

  it('holds one control claim per desktop, released when its connection closes', async () => {
    const gw = await start();
    expect(gw.controlHeld('dsk_a')).toBe(false);
    const { ticket } = gw.grant('dsk_a', 'control');
    expect(gw.controlHeld('dsk_a')).toBe(true);
    expect(gw.controlHeld('dsk_b')).toBe(false);

    const refused = (() => {
      try {
        gw.grant('dsk_a', 'control');
      } catch (err) {
        return err;
      }
      return null;
    })();
    expect(refused).toBeInstanceOf(AgentFailure);
    expect(refused).toMatchObject({ code: 'control_claimed', message: 'another client holds the control claim', retryable: false });
    // Views and other desktops are not blocked.
    gw.grant('dsk_a', 'view');
    gw.grant('dsk_b', 'control');

    const client = await Client.dial(gw.port, `${ticket}\n`);
    await client.waitFor(GREETING);
    expect(gw.controlHeld('dsk_a')).toBe(true);
    client.socket.destroy();
    await until(() => !gw.controlHeld('dsk_a'), 5_000, 'the control claim to be released');
    await servers[0]?.closed;
    expect(gw.grant('dsk_a', 'control').ticket).toMatch(/^stk_/);
  });

  it('releases an unused control ticket when it expires', async () => {
    const gw = await start({ ticketTtlMs: 50 });
    gw.grant('dsk_a', 'control');
    expect(gw.controlHeld('dsk_a')).toBe(true);
    await until(() => !gw.controlHeld('dsk_a'), 5_000, 'the unused control ticket to expire');
    expect(() => gw.grant('dsk_a', 'control')).not.toThrow();
  });

  it('keeps the control claim for a session past its ticket lifetime', async () => {
    const gw = await start({ ticketTtlMs: 50 });
    const grant = gw.grant('dsk_a', 'control');
    const client = await Client.dial(gw.port, `${grant.ticket}\n`);
    await client.waitFor(GREETING);
    await until(() => Date.now() > grant.expiresAt.getTime() + 20, 5_000, 'the ticket lifetime to pass');
    expect(gw.controlHeld('dsk_a')).toBe(true);
    client.socket.destroy();
    await until(() => !gw.controlHeld('dsk_a'), 5_000, 'the control claim to be released');
  });

  it('caps view claims per desktop', async () => {
    const gw = await start();
    for (let i = 0; i < MAX_VIEW_CLAIMS; i++) gw.grant('dsk_a', 'view');
    expect(() => gw.grant('dsk_a', 'view')).toThrow(expect.objectContaining({ code: 'too_large' }));
    expect(() => gw.grant('dsk_b', 'view')).not.toThrow();
    expect(() => gw.grant('dsk_a', 'control')).not.toThrow();
  });

  it('release closes the desktop\u2019s connections, drops its tickets and frees its claim', async () => {
    const gw = await start();
    const control = await Client.dial(gw.port, `${gw.grant('dsk_a', 'control').ticket}\n`);
    const view = await Client.dial(gw.port, `${gw.grant('dsk_a', 'view').ticket}\n`);
    const other = await Client.dial(gw.port, `${gw.grant('dsk_b', 'view').ticket}\n`);
    await Promise.all([control.waitFor(GREETING), view.waitFor(GREETING), other.waitFor(GREETING)]);
    const unused = gw.grant('dsk_a', 'view').ticket;

    gw.release('dsk_a');
    expect(gw.controlHeld('dsk_a')).toBe(false);
    await Promise.all([control.ended, view.ended]);
    await until(() => servers.filter((s) => s.desktopId === 'dsk_a').length === 2, 5_000, 'both servers');
    await Promise.all(servers.filter((s) => s.desktopId === 'dsk_a').map((s) => s.closed));

    const late = await Client.dial(gw.port, `${unused}\n`);
    expect(await late.closedWith()).toBe('ERR not_running\n');
    // The other desktop's session is untouched.
    other.socket.write('still here');
    await other.waitFor('still here');
    other.socket.destroy();
  });

  it('refuses a ticket granted at another generation than the desktop has here now, and frees its claim', async () => {
    let generation = 3;
    const gw = await start({ generationOf: () => generation });
    const before = gw.grant('dsk_a', 'control', 3).ticket;
    // The desktop moved away and back (or was recovered): a newer generation runs here.
    generation = 5;
    const stale = await Client.dial(gw.port, `${before}\n`);
    expect(await stale.closedWith()).toBe('ERR not_running\n');
    expect(servers).toHaveLength(0);
    expect(gw.controlHeld('dsk_a')).toBe(false);
    // The same over the WebSocket path.
    const staleWs = new WebSocket(`ws://127.0.0.1:${gw.port}/vnc?ticket=${gw.grant('dsk_a', 'view', 4).ticket}`);
    const closed = await new Promise<string>((resolve) => staleWs.on('close', (_code, reason) => resolve(reason.toString())));
    expect(closed).toBe('not_running');
    expect(servers).toHaveLength(0);
    // A ticket of the generation it has opens a session.
    const current = await Client.dial(gw.port, `${gw.grant('dsk_a', 'control', 5).ticket}\n`);
    await current.waitFor(GREETING);
    expect(servers).toHaveLength(1);
    current.socket.destroy();
  });

  it('answers not_running or unavailable when the server cannot start, and frees the claim', async () => {
    const gw = await start();
    openFailure = new AgentFailure('not_running', 'desktop dsk_a is not running', false);
    const stopped = await Client.dial(gw.port, `${gw.grant('dsk_a', 'control').ticket}\n`);
    expect(await stopped.closedWith()).toBe('ERR not_running\n');
    await until(() => !gw.controlHeld('dsk_a'), 5_000, 'the control claim to be released');

    openFailure = new AgentFailure('runtime_error', 'x11vnc exploded', true);
    const broken = await Client.dial(gw.port, `${gw.grant('dsk_a', 'control').ticket}\n`);
    expect(await broken.closedWith()).toBe('ERR unavailable\n');
    await until(() => !gw.controlHeld('dsk_a'), 5_000, 'the control claim to be released');
  });

  it('ends the connection when the server exits', async () => {
    const gw = await start();
    const client = await Client.dial(gw.port, `${gw.grant('dsk_a', 'control').ticket}\n`);
    await client.waitFor(GREETING);
    servers[0]?.output.write('bye');
    servers[0]?.exit();
    expect(await client.closedWith()).toBe(`${GREETING}bye`);
    await until(() => !gw.controlHeld('dsk_a'), 5_000, 'the control claim to be released');
  });

  it('close ends every session and refuses new grants', async () => {
    const gw = await start();
    const client = await Client.dial(gw.port, `${gw.grant('dsk_a', 'view').ticket}\n`);
    await client.waitFor(GREETING);
    const pending = await Client.dial(gw.port);
    await gw.close();
    gateway = null;
    await Promise.all([client.ended, pending.ended, servers[0]?.closed]);
    expect(() => gw.grant('dsk_a', 'view')).toThrow(AgentFailure);
  });
});
