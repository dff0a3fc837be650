/**
 * The gateways' line listener (agent/src/line-listener.ts): one client address cannot hold every
 * handshake slot, so silent connections from it do not lock other clients out.
 */
import { connect, type Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { LineListener, MAX_HANDSHAKES_PER_ADDRESS } from '../../agent/src/line-listener.js';

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

  it('caps silent connections per client address, not for everyone', async () => {
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
    const held = [];
    for (let i = 0; i < MAX_HANDSHAKES_PER_ADDRESS; i++) held.push(await dial('127.0.0.1'));
    expect(held.map((h) => h.kept)).toEqual(held.map(() => true));
    expect((await dial('127.0.0.1')).kept).toBe(false);
    // Another address is still served.
    const other = await dial('127.0.0.2', 'hello\n');
    expect(await other.said).toBe('got hello\n');
    // A slot of the first address frees up once one of its connections sends its line.
    held[0]!.socket.write('first\n');
    expect(await held[0]!.said).toBe('got first\n');
    expect((await dial('127.0.0.1')).kept).toBe(true);
  });
});
