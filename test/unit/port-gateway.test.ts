/**
 * The port gateway over real sockets, with a fake `open` that connects to servers in the test
 * process standing for guest apps: an echo server, and an "answer at the end" server that replies
 * only once its input has ended. Covers the signed line (good, bad signature, stale, garbage, too
 * long, silent, ended early), the mapping of open failures to refusals, the relay both ways with
 * early bytes and a large body, half-close in both directions, resets, and closing the gateway;
 * and the generation fence the agent puts in front of `open`.
 */
import { createHash, randomBytes } from 'node:crypto';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { newId } from '../../shared/src/ids.js';
import { PORT_LINK_MAX_SKEW_MS, portLinkKey, portLinkLine, type PortTarget } from '../../shared/src/port-link.js';
import { AgentFailure } from '../../shared/src/protocol.js';
import { fencePortLine } from '../../agent/src/ports/fence.js';
import { PortGateway, refusalFor, type PortGatewayOptions } from '../../agent/src/ports/gateway.js';
import type { GuestConnection } from '../../agent/src/runtime/driver.js';
import { until } from '../helpers/wait.js';

const SECRET = 'test-join-token-0123456789abcdef';
const MiB = 1024 * 1024;


async function listen(server: Server): Promise<number> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const address = server.address();
  if (address === null || typeof address === 'string') throw new Error('no port');
  return address.port;
}

/** A client connection that records everything it receives. */
class Client {
  private chunks: Buffer[] = [];
  readonly ended: Promise<void>;
  gotEnd = false;

  private constructor(readonly socket: Socket) {
    socket.on('data', (chunk: Buffer) => this.chunks.push(chunk));
    socket.on('end', () => (this.gotEnd = true));
    socket.on('error', () => undefined);
    this.ended = new Promise((resolve) => socket.once('close', () => resolve()));
  }

  /** `halfOpen`: the client's side stays open after the gateway's ends (it closes by itself otherwise). */
  static async dial(port: number, first?: string | Buffer, halfOpen = false): Promise<Client> {
    const socket = connect({ host: '127.0.0.1', port, allowHalfOpen: halfOpen });
    await new Promise<void>((resolve, reject) => {
      socket.once('connect', resolve);
      socket.once('error', reject);
    });
    const client = new Client(socket);
    if (first !== undefined) socket.write(first);
    return client;
  }

  get bytes(): Buffer {
    return Buffer.concat(this.chunks);
  }

  get text(): string {
    return this.bytes.toString('latin1');
  }

  async waitFor(text: string): Promise<void> {
    await until(() => this.text.includes(text), 5_000, `client to receive ${JSON.stringify(text)}`);
  }

  /** Everything received once the connection is closed. */
  async closedWith(): Promise<string> {
    await this.ended;
    return this.text;
  }
}

describe('port gateway', () => {
  let gateway: PortGateway | null = null;
  const logs: Array<{ msg: string; fields?: object }> = [];
  const opened: PortTarget[] = [];
  /** Guest-side sockets of the "guest app" servers, to check what they saw. */
  const guestSockets: Socket[] = [];
  let echoPort = 0;
  let answerPort = 0;
  let closedPort = 0;
  let echo: Server;
  let answer: Server;
  /** What the answer server received before its input ended, per connection. */
  const answered: Buffer[] = [];

  beforeAll(async () => {
    echo = createServer({ allowHalfOpen: true }, (socket) => {
      guestSockets.push(socket);
      socket.on('error', () => undefined);
      socket.pipe(socket);
    });
    echoPort = await listen(echo);
    // Replies with the length and hash of its input once the input has ended.
    answer = createServer({ allowHalfOpen: true }, (socket) => {
      guestSockets.push(socket);
      socket.on('error', () => undefined);
      const parts: Buffer[] = [];
      socket.on('data', (c: Buffer) => parts.push(c));
      socket.on('end', () => {
        const all = Buffer.concat(parts);
        answered.push(all);
        socket.end(`${all.length} ${createHash('sha256').update(all).digest('hex')}\n`);
      });
    });
    answerPort = await listen(answer);
    const closed = createServer();
    closedPort = await listen(closed);
    await new Promise<void>((resolve) => closed.close(() => resolve()));
  });

  afterAll(async () => {
    for (const s of guestSockets) s.destroy();
    await Promise.all([echo, answer].map((s) => new Promise<void>((resolve) => s.close(() => resolve()))));
  });

  async function start(options: Partial<PortGatewayOptions> = {}, key: string | null = SECRET): Promise<PortGateway> {
    logs.length = 0;
    opened.length = 0;
    gateway = await PortGateway.start({
      listenHost: '127.0.0.1',
      port: 0,
      open: async (target) => {
        opened.push(target);
        const socket = connect({ host: '127.0.0.1', port: target.port, allowHalfOpen: true });
        await new Promise<void>((resolve, reject) => {
          socket.once('connect', resolve);
          socket.once('error', reject);
        });
        return socket;
      },
      log: (msg, fields) => logs.push({ msg, fields }),
      ...options,
    });
    if (key !== null) gateway.setKey(key);
    return gateway;
  }

  afterEach(async () => {
    await gateway?.close();
    gateway = null;
  });

  const target = (port: number, generation = 3): PortTarget => ({ desktopId: newId('desktop'), generation, port });

  it('answers OK to a good line and relays both ways, early bytes first', async () => {
    const gw = await start();
    const t = target(echoPort);
    const line = portLinkLine(SECRET, t);
    // The first bytes for the guest ride in the same packet as the line.
    const client = await Client.dial(gw.port, `${line}early;`);
    await client.waitFor('OK\nearly;');
    expect(opened).toEqual([t]);
    client.socket.write('ping');
    await client.waitFor('ping');
    expect(client.text).toBe('OK\nearly;ping');
    client.socket.end();
    await client.ended;
    // The echo server ended its side when ours ended: a clean close both ways.
    expect(client.gotEnd).toBe(true);
    // No log line carries the line or its signature.
    const mac = line.trim().split(' ').at(-1) ?? '';
    expect(JSON.stringify(logs)).not.toContain(mac);
    expect(JSON.stringify(logs)).not.toContain(SECRET);
    expect(logs.map((l) => l.msg)).toEqual(expect.arrayContaining(['port connection opened', 'port connection closed']));
  });

  it('accepts a CRLF line', async () => {
    const gw = await start();
    const client = await Client.dial(gw.port, `${portLinkLine(SECRET, target(echoPort)).trimEnd()}\r\nx`);
    await client.waitFor('OK\nx');
    client.socket.destroy();
  });

  it('refuses bad signatures, stale and future timestamps, garbage, long lines and silence', async () => {
    const gw = await start({ handshakeTimeoutMs: 150 });
    const t = target(echoPort);
    const refused = async (first: string | undefined) => (await Client.dial(gw.port, first)).closedWith();
    expect(await refused(portLinkLine('another-secret', t))).toBe('ERR unauthorized\n');
    // A line taken once (a /2 line carries a nonce) opens nothing more: one seen on the network is spent.
    const once = portLinkLine(SECRET, t);
    const first = await Client.dial(gw.port, once);
    await first.waitFor('OK\n');
    first.socket.destroy();
    expect(await refused(once)).toBe('ERR unauthorized\n');
    // The signature of another target.
    const [, , , , at, mac] = portLinkLine(SECRET, t, Date.now(), 1).trim().split(' ');
    expect(await refused(`CANTO-PORT/1 ${t.desktopId} ${t.generation} ${t.port + 1} ${at} ${mac}\n`)).toBe('ERR unauthorized\n');
    expect(await refused(portLinkLine(SECRET, t, Date.now() - PORT_LINK_MAX_SKEW_MS - 1_000))).toBe('ERR unauthorized\n');
    expect(await refused(portLinkLine(SECRET, t, Date.now() + PORT_LINK_MAX_SKEW_MS + 1_000))).toBe('ERR unauthorized\n');
    expect(await refused('GET / HTTP/1.1\r\nHost: x\r\n\r\n')).toBe('ERR unauthorized\n');
    expect(await refused('\n')).toBe('ERR unauthorized\n');
    // Over-long: refused without waiting for a newline, and a long line with one too.
    expect(await refused('x'.repeat(300))).toBe('ERR unauthorized\n');
    expect(await refused(`${portLinkLine(SECRET, t).trimEnd()}${' '.repeat(200)}\n`)).toBe('ERR unauthorized\n');
    // No newline before the deadline, or nothing at all.
    expect(await refused(portLinkLine(SECRET, t).trimEnd())).toBe('ERR unauthorized\n');
    expect(await refused(undefined)).toBe('ERR unauthorized\n');
    // Only the line taken once was let through.
    expect(opened).toEqual([t]);
  });

  it('refuses every line until it has its key, and lines signed with another host key', async () => {
    const gw = await start({}, null);
    const t = target(echoPort);
    const refused = async (first: string) => (await Client.dial(gw.port, first)).closedWith();
    expect(await refused(portLinkLine(SECRET, t))).toBe('ERR unauthorized\n');
    gw.setKey(portLinkKey('scheduler secret', 'host-a'));
    expect(await refused(portLinkLine(portLinkKey('scheduler secret', 'host-b'), t))).toBe('ERR unauthorized\n');
    expect(await refused(portLinkLine('scheduler secret', t))).toBe('ERR unauthorized\n');
    const client = await Client.dial(gw.port, portLinkLine(portLinkKey('scheduler secret', 'host-a'), t));
    await client.waitFor('OK\n');
    client.socket.destroy();
    expect(opened).toEqual([t]);
  });

  it('refuses a client that ends before its newline', async () => {
    const gw = await start();
    const client = await Client.dial(gw.port, 'CANTO-PORT/1 partial');
    client.socket.end();
    expect(await client.closedWith()).toBe('ERR unauthorized\n');
  });

  it('maps open failures to refusals', async () => {
    const failures: unknown[] = [
      new AgentFailure('not_running', 'hibernated', false),
      new AgentFailure('not_found', 'gone', false),
      new AgentFailure('stale_generation', 'moved', false),
      new AgentFailure('runtime_error', 'broken', true),
      new Error('something else'),
    ];
    let next = 0;
    const gw = await start({ open: async () => Promise.reject(failures[next++]) });
    const answers: string[] = [];
    for (let i = 0; i < failures.length; i++) {
      answers.push(await (await Client.dial(gw.port, portLinkLine(SECRET, target(echoPort)))).closedWith());
    }
    expect(answers).toEqual(['ERR not_running\n', 'ERR not_running\n', 'ERR not_running\n', 'ERR unavailable\n', 'ERR unavailable\n']);
    expect(refusalFor(Object.assign(new Error('x'), { code: 'ECONNREFUSED' }))).toBe('refused');
    expect(refusalFor(Object.assign(new Error('x'), { code: 'ETIMEDOUT' }))).toBe('unavailable');
  });

  it('answers refused when nothing listens on the port', async () => {
    const gw = await start();
    const client = await Client.dial(gw.port, portLinkLine(SECRET, target(closedPort)));
    expect(await client.closedWith()).toBe('ERR refused\n');
    expect(logs.find((l) => l.msg === 'port connection refused')?.fields).toMatchObject({ code: 'refused', port: closedPort });
  });

  it('passes a client half-close on: the app sees its input end and its answer still arrives', async () => {
    const gw = await start();
    const body = randomBytes(3 * MiB);
    const client = await Client.dial(gw.port, portLinkLine(SECRET, target(answerPort)));
    client.socket.write(body);
    client.socket.end();
    const text = await client.closedWith();
    const sha = createHash('sha256').update(body).digest('hex');
    expect(text).toBe(`OK\n${body.length} ${sha}\n`);
    expect(client.gotEnd).toBe(true);
  });

  it('passes a guest half-close on: the client keeps sending after the app ended its side', async () => {
    let got = '';
    let sawEnd = false;
    const app = createServer({ allowHalfOpen: true }, (socket) => {
      guestSockets.push(socket);
      socket.end('bye\n');
      socket.on('data', (c: Buffer) => (got += c.toString()));
      socket.on('end', () => (sawEnd = true));
    });
    const port = await listen(app);
    try {
      const gw = await start();
      const client = await Client.dial(gw.port, portLinkLine(SECRET, target(port)), true);
      await until(() => client.gotEnd, 5_000, 'the app end to reach the client');
      expect(client.text).toBe('OK\nbye\n');
      client.socket.write('still here');
      await until(() => got === 'still here', 5_000, 'the app to get bytes after its end');
      client.socket.end();
      await client.ended;
      await until(() => sawEnd, 5_000, 'the app to see the client end');
    } finally {
      await new Promise<void>((resolve) => app.close(() => resolve()));
    }
  });

  it('relays a large body both ways with backpressure', async () => {
    const gw = await start();
    const body = randomBytes(20 * MiB);
    const client = await Client.dial(gw.port, portLinkLine(SECRET, target(echoPort)));
    client.socket.end(body);
    await client.ended;
    expect(client.bytes.length).toBe(3 + body.length);
    expect(client.bytes.subarray(3).equals(body)).toBe(true);
  });

  it('closes the guest connection when the client resets, and the client when the guest does', async () => {
    const gw = await start();
    const before = guestSockets.length;
    const client = await Client.dial(gw.port, portLinkLine(SECRET, target(echoPort)));
    await client.waitFor('OK\n');
    await until(() => guestSockets.length === before + 1, 5_000, 'the echo server to accept');
    const guest = guestSockets.at(-1) as Socket;
    client.socket.resetAndDestroy();
    await until(() => guest.destroyed, 5_000, 'the guest side to close');

    const second = await Client.dial(gw.port, portLinkLine(SECRET, target(echoPort)));
    await second.waitFor('OK\n');
    await until(() => guestSockets.length === before + 2, 5_000, 'the echo server to accept');
    (guestSockets.at(-1) as Socket).resetAndDestroy();
    await second.ended;
  });

  it('drops a client that leaves while its port opens, and closes everything on close', async () => {
    let release: () => void = () => undefined;
    let calls = 0;
    const held: GuestConnection[] = [];
    const gw = await start({
      open: async (t) => {
        calls++;
        await new Promise<void>((resolve) => (release = resolve));
        const socket = connect({ host: '127.0.0.1', port: t.port, allowHalfOpen: true });
        held.push(socket);
        await new Promise<void>((resolve) => socket.once('connect', resolve));
        return socket;
      },
    });
    const leaver = await Client.dial(gw.port, portLinkLine(SECRET, target(echoPort)));
    await until(() => calls === 1, 5_000, 'the port to be opening');
    leaver.socket.destroy();
    await leaver.ended;
    release();
    await until(() => held.length === 1 && held[0]!.destroyed, 5_000, 'the late guest connection to be closed');

    const stayer = await Client.dial(gw.port, portLinkLine(SECRET, target(echoPort)));
    await until(() => calls === 2, 5_000, 'the port to be opening');
    release();
    await stayer.waitFor('OK\n');
    await gw.close();
    gateway = null;
    await stayer.ended;
    await until(() => held[1]?.destroyed === true, 5_000, 'the guest connection to be closed');
    await expect(Client.dial(gw.port)).rejects.toThrow();
  });
});

describe('port line fencing', () => {
  const target = { desktopId: newId('desktop'), generation: 7, port: 8000 };
  const code = (held: number | undefined) => {
    try {
      fencePortLine(held, target);
      return 'ok';
    } catch (err) {
      return err instanceof AgentFailure ? err.code : String(err);
    }
  };

  it('serves the generation held and a newer one, and refuses an older one or an unknown desktop', () => {
    expect(code(7)).toBe('ok');
    // The start command carried 6; the transition to awake made it 7.
    expect(code(6)).toBe('ok');
    expect(code(8)).toBe('stale_generation');
    expect(code(undefined)).toBe('stale_generation');
  });
});
