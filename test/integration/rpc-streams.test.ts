/**
 * Byte streams on the agent link (shared/src/rpc.ts, byte-stream.ts) over a real websocket: an
 * upload reaches the handler in order and whole, an aborted upload fails the handler's read, a
 * download follows its reply, and a closed link fails both kinds of stream instead of hanging.
 * Every case runs with chunks as msgpack notifications and as raw messages (protocol 1.6), and
 * peers of different versions understand each other. Raw streams are flow-controlled: a sender
 * pulls no more than the window ahead of its receiver's consumer, and stops when nobody will read.
 */
import { createHash, randomBytes } from 'node:crypto';
import { createRequire } from 'node:module';
import type { AddressInfo, Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import WebSocket, { WebSocketServer } from 'ws';
import { WithDownload } from '../../shared/src/byte-stream.js';
import { AgentFailure } from '../../shared/src/protocol.js';
import { RpcPeer } from '../../shared/src/rpc.js';
import { STREAM_WINDOW_BYTES } from '../../shared/src/rpc-streams.js';
import { until } from '../helpers/wait.js';

const sha = (b: Uint8Array) => createHash('sha256').update(b).digest('hex');

async function collect(source: AsyncIterable<Buffer>): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const part of source) parts.push(part);
  return Buffer.concat(parts);
}

async function* pieces(data: Buffer, size: number, failAt = -1): AsyncGenerator<Buffer> {
  for (let i = 0; i < data.length; i += size) {
    if (failAt >= 0 && i >= failAt) throw new Error('client went away');
    await new Promise((r) => setImmediate(r));
    yield data.subarray(i, i + size);
  }
}

/** Two peers over a real websocket on a new server; `raw` turns raw stream chunks on for both. */
async function link(raw: boolean): Promise<{ server: WebSocketServer; scheduler: RpcPeer; agent: RpcPeer; agentSocket: WebSocket }> {
  const server = new WebSocketServer({ port: 0, host: '127.0.0.1' });
  await new Promise((r) => server.once('listening', r));
  const accepted = new Promise<RpcPeer>((resolve) => server.once('connection', (ws) => resolve(new RpcPeer(ws))));
  const ws = new WebSocket(`ws://127.0.0.1:${(server.address() as AddressInfo).port}`);
  await new Promise((r) => ws.once('open', r));
  const agent = new RpcPeer(ws);
  const scheduler = await accepted;
  agent.binaryStreams = raw;
  scheduler.binaryStreams = raw;
  return { server, scheduler, agent, agentSocket: ws };
}

describe.each([
  ['msgpack chunks', false],
  ['raw chunks', true],
])('byte streams on the agent link, %s', (_name, raw) => {
  let server: WebSocketServer | null = null;
  let client: RpcPeer | null = null;
  let remote: RpcPeer | null = null;

  afterEach(async () => {
    client?.close();
    remote?.close();
    await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()));
    server = null;
  });

  /** `scheduler` sends requests; `agent` handles them. */
  async function pair(): Promise<{ scheduler: RpcPeer; agent: RpcPeer }> {
    const linked = await link(raw);
    server = linked.server;
    client = linked.agent;
    remote = linked.scheduler;
    return linked;
  }

  it('delivers an upload whole and in order before the reply', async () => {
    const { scheduler, agent } = await pair();
    agent.handle('put', async (payload, ctx) => {
      const bytes = await collect(ctx.upload!);
      return { name: (payload as { name: string }).name, size: bytes.length, sha: sha(bytes) };
    });
    const data = randomBytes(3 * 1024 * 1024 + 17);
    const reply = await scheduler.request('put', { name: 'f' }, 10_000, pieces(data, 65_536));
    expect(reply).toEqual({ name: 'f', size: data.length, sha: sha(data) });
  });

  it('fails the handler read when the uploader aborts, and the handler can answer', async () => {
    const { scheduler, agent } = await pair();
    agent.handle('put', async (_p, ctx) => {
      try {
        await collect(ctx.upload!);
        return { aborted: false };
      } catch (err) {
        throw new AgentFailure('bad_request', `upload aborted: ${(err as Error).message}`, false);
      }
    });
    const err = await scheduler.request('put', {}, 10_000, pieces(randomBytes(1024 * 1024), 65_536, 512 * 1024)).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AgentFailure);
    expect((err as AgentFailure).message).toContain('client went away');
  });

  it('streams a download after the reply', async () => {
    const { scheduler, agent } = await pair();
    const data = randomBytes(2 * 1024 * 1024 + 5);
    agent.handle('get', async () => new WithDownload({ size: data.length }, pieces(data, 100_000)));
    const { result, body } = await scheduler.requestDownload('get', {}, 10_000);
    expect(result).toEqual({ size: data.length });
    expect(sha(await collect(body))).toBe(sha(data));
  });

  it('fails a download whose source breaks, and one whose link closes', async () => {
    const { scheduler, agent } = await pair();
    agent.handle('broken', async () => new WithDownload({}, pieces(randomBytes(1024 * 1024), 65_536, 256 * 1024)));
    const broken = await scheduler.requestDownload('broken', {}, 10_000);
    await expect(collect(broken.body)).rejects.toThrow(/client went away/);

    let release: () => void = () => undefined;
    const held = new Promise<void>((r) => (release = r));
    agent.handle('stalls', async () => new WithDownload({}, (async function* () {
      yield Buffer.from('first');
      await held;
    })()));
    const stalled = await scheduler.requestDownload('stalls', {}, 10_000);
    const reading = collect(stalled.body);
    agent.close();
    await expect(reading).rejects.toMatchObject({ code: 'disconnected' });
    release();
  });

  it('a plain request on a download still settles the body (empty)', async () => {
    const { scheduler, agent } = await pair();
    agent.handle('get', async () => ({ nothing: true }));
    const { result, body } = await scheduler.requestDownload('get', {}, 10_000);
    expect(result).toEqual({ nothing: true });
    expect((await collect(body)).length).toBe(0);
  });
});

describe('flow control of raw streams', () => {
  let server: WebSocketServer | null = null;
  const peers: RpcPeer[] = [];
  afterEach(async () => {
    for (const p of peers.splice(0)) p.close();
    await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()));
    server = null;
  });

  async function pair(): Promise<{ scheduler: RpcPeer; agent: RpcPeer }> {
    const linked = await link(true);
    server = linked.server;
    peers.push(linked.agent, linked.scheduler);
    return linked;
  }

  /** A source of 64 KiB chunks that counts what was pulled and notes when it is returned. */
  function counted(total: number) {
    const state = { pulled: 0, returned: false };
    const source = (async function* () {
      try {
        for (let sent = 0; sent < total; sent += 65_536) {
          state.pulled += 65_536;
          yield randomBytes(65_536);
        }
      } finally {
        state.returned = true;
      }
    })();
    return { state, source };
  }

  const settle = () => new Promise((r) => setTimeout(r, 200));

  it('pulls no more of an upload than the window while the handler does not read', async () => {
    const { scheduler, agent } = await pair();
    let read: () => void = () => undefined;
    const reading = new Promise<void>((r) => (read = r));
    agent.handle('put', async (_p, ctx) => {
      await reading;
      return { size: (await collect(ctx.upload!)).length };
    });
    const { state, source } = counted(8 * 1024 * 1024);
    const reply = scheduler.request('put', {}, 10_000, source);
    await settle();
    expect(state.pulled).toBeLessThanOrEqual(STREAM_WINDOW_BYTES + 65_536);
    read();
    expect(await reply).toEqual({ size: 8 * 1024 * 1024 });
  });

  it('returns the source of an upload its handler answered without reading', async () => {
    const { scheduler, agent } = await pair();
    agent.handle('put', async () => ({ ignored: true }));
    const { state, source } = counted(8 * 1024 * 1024);
    expect(await scheduler.request('put', {}, 10_000, source)).toEqual({ ignored: true });
    await settle();
    expect(state.returned).toBe(true);
    expect(state.pulled).toBeLessThan(8 * 1024 * 1024);
  });

  it('cancels a download its consumer gave up, and the handler\'s source is returned', async () => {
    const { scheduler, agent } = await pair();
    const { state, source } = counted(64 * 1024 * 1024);
    agent.handle('get', async () => new WithDownload({}, source));
    const { body } = await scheduler.requestDownload('get', {}, 10_000);
    for await (const _chunk of body) break;
    await settle();
    expect(state.returned).toBe(true);
    expect(state.pulled).toBeLessThanOrEqual(STREAM_WINDOW_BYTES + 2 * 65_536);
  });

  it('wakes a sender waiting for credit when the link closes', async () => {
    const { scheduler, agent } = await pair();
    agent.handle('put', () => new Promise(() => undefined));
    const { state, source } = counted(8 * 1024 * 1024);
    const reply = scheduler.request('put', {}, 10_000, source).catch((e: unknown) => e);
    await settle();
    agent.close();
    expect(await reply).toMatchObject({ code: 'disconnected' });
    await settle();
    expect(state.returned).toBe(true);
  });
});

describe('the link\'s websocket', () => {
  it('masks with the native bufferutil, not the JavaScript fallback', () => {
    // The agent masks every byte it sends and the scheduler unmasks them: in JavaScript that was
    // 13 ms per 8 MiB on each side, a third of a download's time.
    const require = createRequire(import.meta.url);
    expect(require('bufferutil')).not.toBe(require('bufferutil/fallback'));
  });
});

describe('raw chunks sent in one event-loop turn', () => {
  it('leave in one write to the socket', async () => {
    const { server, scheduler, agent, agentSocket } = await link(true);
    try {
      const tcp = (agentSocket as unknown as { _socket: Socket })._socket;
      let writes = 0;
      for (const method of ['_write', '_writev'] as const) {
        const original = tcp[method]!.bind(tcp) as (...args: unknown[]) => void;
        (tcp as unknown as Record<string, unknown>)[method] = (...args: unknown[]) => {
          writes++;
          original(...args);
        };
      }
      const data = randomBytes(32 * 16_384);
      // No I/O between chunks: the whole download is produced in one turn.
      agent.handle('get', async () => new WithDownload({}, (async function* () {
        for (let i = 0; i < data.length; i += 16_384) yield data.subarray(i, i + 16_384);
      })()));
      const { body } = await scheduler.requestDownload('get', {}, 10_000);
      expect(sha(await collect(body))).toBe(sha(data));
      // The reply, then every header, chunk and the end together; unbatched it is one per message.
      expect(writes).toBeLessThanOrEqual(3);
    } finally {
      agent.close();
      scheduler.close();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });
});

describe('raw stream chunks between peers of different versions', () => {
  it('an old sender and a new one are both understood, and a bad raw header is a protocol error', async () => {
    const server = new WebSocketServer({ port: 0, host: '127.0.0.1' });
    await new Promise((r) => server.once('listening', r));
    const errors: string[] = [];
    const accepted = new Promise<RpcPeer>((resolve) => server.once('connection', (ws) => resolve(new RpcPeer(ws, (m) => errors.push(m)))));
    const ws = new WebSocket(`ws://127.0.0.1:${(server.address() as AddressInfo).port}`);
    await new Promise((r) => ws.once('open', r));
    const agent = new RpcPeer(ws);
    const scheduler = await accepted;
    try {
      // The scheduler knows the agent is new (raw uploads); the agent thinks the scheduler is old.
      scheduler.binaryStreams = true;
      const data = randomBytes(1024 * 1024 + 3);
      let rawHeaders = 0;
      ws.on('message', (m: Buffer) => (rawHeaders += m[0] === 0xc1 && m.length === 10 ? 1 : 0));
      agent.handle('sum', async (_p, ctx) => ({ sha: sha(await collect(ctx.upload!)) }));
      expect(await scheduler.request('sum', {}, 10_000, pieces(data, 65_536))).toEqual({ sha: sha(data) });
      expect(rawHeaders).toBe(Math.ceil(data.length / 65_536));
      agent.handle('get', async () => new WithDownload({}, pieces(data, 300_000)));
      expect(sha(await collect((await scheduler.requestDownload('get', {}, 10_000)).body))).toBe(sha(data));

      ws.send(Buffer.from([0xc1, 9, 0, 0, 0, 1, 0, 0, 0, 4]));
      await until(() => errors.length > 0);
      expect(errors).toEqual(['malformed raw stream header']);
    } finally {
      agent.close();
      scheduler.close();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });
});

