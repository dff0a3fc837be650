/**
 * The gateways' line listener (agent/src/line-listener.ts): one client network (a /24, a /64)
 * cannot hold every handshake slot, so silent connections from it, from however many of its
 * addresses, do not lock other clients out, yet a burst of honest handshakes from one address (the
 * scheduler's ingress) is not refused. Loopback's 127/8 gives the test networks of its own.
 */
import { connect, type Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { clientNetwork, FAIR_SHARE_FROM, LineListener, MAX_HANDSHAKES, MAX_HANDSHAKES_PER_ADDRESS } from '../../agent/src/line-listener.js';

describe('line listener', () => {
  let listener: LineListener | null = null;
  const sockets: Socket[] = [];
  afterEach(async () => {
    for (const s of sockets.splice(0)) s.destroy();
    await listener?.close();
  });

  /** A connection from `from`; resolves with whether the listener kept it (false: dropped at once). */
  function dial(from: string, line?: string): Promise<{ kept: boolean; socket: Socket; said: Promise<string> }> {
    return new Promise((resolve) => {
      const socket = connect({ host: '127.0.0.1', port: listener!.port, localAddress: from });
      sockets.push(socket);
      let text = '';
      const said = new Promise<string>((done) => {
        socket.on('data', (d: Buffer) => (text += d.toString('latin1')));
        socket.once('close', () => done(text));
      });
      socket.on('error', () => undefined);
      socket.once('connect', () => {
        if (line !== undefined) socket.write(line);
        // A dropped connection closes at once; a kept one is still open a moment later.
        const timer = setTimeout(() => resolve({ kept: true, socket, said }), 150);
        socket.once('close', () => {
          clearTimeout(timer);
          resolve({ kept: false, socket, said });
        });
      });
    });
  }

  async function start(): Promise<void> {
    listener = await LineListener.start({
      listenHost: '127.0.0.1',
      port: 0,
      maxLineBytes: 64,
      handshakeTimeoutMs: 10_000,
      name: 'test gateway',
      log: () => undefined,
      onLine: (socket, line) => socket.end(`got ${line}\n`),
      onNoLine: (socket) => socket.destroy(),
    });
  }

  async function hold(from: string, count: number) {
    const held = await Promise.all(Array.from({ length: count }, () => dial(from)));
    expect(held.every((h) => h.kept)).toBe(true);
    return held;
  }

  it('takes a burst of handshakes from one address while slots are plentiful', async () => {
    await start();
    // The ingress opens a link per request: twenty still owing their line at once from one
    // address are all honest, and all served.
    const burst = await hold('127.0.0.1', 20);
    burst.forEach((b, i) => b.socket.write(`r${i}\n`));
    expect(await Promise.all(burst.map((b) => b.said))).toEqual(burst.map((_, i) => `got r${i}\n`));
  });

  it('caps silent connections per client network once half the slots are taken', async () => {
    await start();
    const crowd = await hold('127.0.0.1', FAIR_SHARE_FROM - MAX_HANDSHAKES_PER_ADDRESS);
    // Another network's share, held from many of its addresses.
    for (let i = 0; i < MAX_HANDSHAKES_PER_ADDRESS; i++) await hold(`127.0.2.${1 + (i % 200)}`, 1);
    // Half the slots are taken: both networks are at or over their share (whichever of their
    // addresses asks), a third is not.
    expect((await dial('127.0.0.1')).kept).toBe(false);
    expect((await dial('127.0.0.77')).kept).toBe(false);
    expect((await dial('127.0.2.250')).kept).toBe(false);
    const other = await dial('127.0.3.1', 'hello\n');
    expect(await other.said).toBe('got hello\n');
    // Slots free up as connections send their lines: below half, the crowd is served again.
    for (const c of crowd.slice(0, 2)) c.socket.write('line\n');
    await Promise.all(crowd.slice(0, 2).map((c) => c.said));
    expect((await dial('127.0.0.1')).kept).toBe(true);
  });

  it('drops everything past the total cap', async () => {
    await start();
    for (let i = 0; i < MAX_HANDSHAKES / MAX_HANDSHAKES_PER_ADDRESS; i++) await hold(`127.0.${10 + i}.1`, MAX_HANDSHAKES_PER_ADDRESS);
    expect((await dial('127.0.99.1')).kept).toBe(false);
  });

  it('tells client networks apart: a /24 of IPv4, however written, and a /64 of IPv6', () => {
    expect(clientNetwork('203.0.113.7')).toBe(clientNetwork('203.0.113.250'));
    expect(clientNetwork('::ffff:203.0.113.7')).toBe(clientNetwork('203.0.113.9'));
    expect(clientNetwork('203.0.113.7')).not.toBe(clientNetwork('203.0.114.7'));
    expect(clientNetwork('2001:db8:1:2::9')).toBe(clientNetwork('2001:db8:1:2:ffff:ffff:ffff:ffff'));
    expect(clientNetwork('2001:db8:1:2::9')).toBe(clientNetwork('2001:0DB8:0001:0002:0:0:0:1'));
    expect(clientNetwork('2001:db8:1:2::9')).not.toBe(clientNetwork('2001:db8:1:3::9'));
    expect(clientNetwork('fe80::1%eth0')).toBe(clientNetwork('fe80::2'));
  });
});
