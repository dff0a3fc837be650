/**
 * The agent's WebSocket relays (agent/src/stream/websockets.ts): what a viewer sends to the VNC
 * server waits in the viewer's socket while the server does not read it, instead of piling up in
 * the agent (a client that sends without reading cannot grow the agent's memory); and a client
 * that never answers a close frame is cut off after the linger, not ws's default 30 s.
 */
import { once } from 'node:events';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { PassThrough, Writable } from 'node:stream';
import { afterEach, expect, it } from 'vitest';
import WebSocket, { type WebSocketServer } from 'ws';
import { relayVnc, webSocketServer } from '../../agent/src/stream/websockets.js';
import { LINGER_MS } from '../../agent/src/line-listener.js';
import { until } from '../helpers/wait.js';

let server: Server | null = null;
let wss: WebSocketServer | null = null;
afterEach(async () => {
  wss?.close();
  server?.closeAllConnections();
  await new Promise((resolve) => (server ? server.close(resolve) : resolve(undefined)));
  server = wss = null;
});

/** A served WebSocket (the agent's end) and a client connected to it. */
async function pair(): Promise<{ agentEnd: WebSocket; client: WebSocket }> {
  wss = webSocketServer();
  server = createServer();
  server.on('upgrade', (req, socket, head) => wss!.handleUpgrade(req, socket, head, (ws) => wss!.emit('connection', ws)));
  await new Promise<void>((resolve) => server!.listen(0, '127.0.0.1', resolve));
  const accepted = once(wss, 'connection') as Promise<[WebSocket]>;
  const client = new WebSocket(`ws://127.0.0.1:${(server.address() as AddressInfo).port}/`, 'binary');
  await once(client, 'open');
  return { agentEnd: (await accepted)[0], client };
}

it("stops reading a viewer's socket while the VNC server does not read what it sent", async () => {
  const { agentEnd, client } = await pair();
  // A VNC server that has stopped reading: nothing written to it completes until `release`.
  const held: Array<() => void> = [];
  const input = new Writable({ highWaterMark: 64 * 1024, write: (_chunk, _enc, done) => void held.push(done) });
  relayVnc(agentEnd, { input, output: new PassThrough(), closed: new Promise(() => {}), close: () => {} });
  const frame = Buffer.alloc(256 * 1024, 5);
  for (let i = 0; i < 64; i++) client.send(frame);
  await until(() => agentEnd.isPaused, 10_000, 'the relay to stop reading the socket');
  // Two frames at most reached the agent's side: the rest (16 MiB) wait in the sockets.
  await new Promise((resolve) => setTimeout(resolve, 200));
  expect(input.writableLength).toBeLessThanOrEqual(2 * frame.length);
  // Once the server reads again, the relay reads on, to the last frame.
  let taken = 0;
  input._write = (chunk: Buffer, _enc, done) => {
    taken += chunk.length;
    done();
  };
  for (const done of held.splice(0)) done();
  await until(() => taken >= 62 * frame.length, 10_000, 'every frame to reach the server');
  client.terminate();
});

it('cuts off a client that never answers its close frame after the linger', async () => {
  const { agentEnd, client } = await pair();
  // The client's socket stops reading, so the close frame is never answered.
  (client as unknown as { _socket: { pause(): void } })._socket.pause();
  const t0 = Date.now();
  agentEnd.close(1000, 'done');
  await once(agentEnd, 'close');
  expect(Date.now() - t0).toBeLessThan(LINGER_MS + 3_000);
  client.terminate();
});
