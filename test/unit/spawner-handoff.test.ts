/**
 * Sockets handed to children through the process spawner (spawner.ts `socket`, with the helper's
 * IPC channel, agent/native/handoff.c): the child gets the connection as its fd 1 and talks on it
 * both ways after this process closed its own copy; a burst of handoffs gives each child its own
 * connection; the helper answers Node's question when the server that accepted a handed-over
 * socket closes (else `server.close` never calls back); and, without the helper, Node's spawn
 * shares the socket the same way. Real processes and sockets throughout.
 */
import { once } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnProcess } from '../../agent/src/runtime/sandbox/host/spawner.js';
import { runWithoutSpawner, SPAWNER } from '../helpers/spawner-off.js';

let dir: string;
let server: Server;
/** Connections the server accepted, in order; their peers are the test's clients. */
const accepted: Socket[] = [];

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'canto-handoff-'));
  server = createServer((s) => void accepted.push(s));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
});

afterAll(async () => {
  server.close();
  await rm(dir, { recursive: true, force: true });
});

/** A client connected to the server, and the server's end of it. */
async function pair(): Promise<{ client: Socket; served: Socket }> {
  const before = accepted.length;
  const client = connect({ host: '127.0.0.1', port: (server.address() as { port: number }).port });
  await once(client, 'connect');
  while (accepted.length === before) await new Promise((r) => setTimeout(r, 5));
  return { client, served: accepted[before]! };
}

/** Reads from `socket` until `n` bytes came. */
function read(socket: Socket, n: number): Promise<string> {
  return new Promise((resolve) => {
    let got = '';
    const onData = (c: Buffer) => {
      got += c.toString();
      if (got.length < n) return;
      socket.off('data', onData);
      resolve(got);
    };
    socket.on('data', onData);
  });
}

describe('sockets handed to children', () => {
  it("gives the child the connection as its fd 1, both ways, once this process's copy is closed", async () => {
    const { client, served } = await pair();
    // Writes on fd 1, then echoes what it reads there to stderr. The descriptor comes as Node
    // had it, non-blocking: the child waits for input with select.
    const echo = 'import os, select\nos.write(1, b"ready")\nselect.select([1], [], [])\nos.write(2, os.read(1, 5))';
    const child = await spawnProcess('python3', ['-c', echo], { stdio: ['ignore', 'ignore', 'pipe'], socket: served });
    served.destroy();
    let err = '';
    child.stderr!.on('data', (c: Buffer) => (err += c.toString()));
    expect(await read(client, 5)).toBe('ready');
    client.write('hello');
    await once(child, 'close');
    expect(err).toBe('hello');
    client.destroy();
  });

  it('gives each child of a burst its own connection', async () => {
    const pairs: Array<{ client: Socket; served: Socket }> = [];
    for (let i = 0; i < 6; i++) pairs.push(await pair());
    const children = await Promise.all(
      pairs.map((p, i) => spawnProcess('sh', ['-c', `printf ${i}`], { stdio: ['ignore', 'ignore', 'ignore'], socket: p.served })),
    );
    for (const p of pairs) p.served.destroy();
    const got = await Promise.all(pairs.map((p) => read(p.client, 1)));
    expect(got).toEqual(['0', '1', '2', '3', '4', '5']);
    await Promise.all(children.map((c) => (c.exitCode === null ? once(c, 'exit') : null)));
    for (const p of pairs) p.client.destroy();
  });

  it("lets the accepting server close: the helper answers Node's count of the connections it holds", async () => {
    const own = createServer();
    const took = new Promise<Socket>((resolve) => own.once('connection', resolve));
    await new Promise<void>((resolve) => own.listen(0, '127.0.0.1', resolve));
    const client = connect({ host: '127.0.0.1', port: (own.address() as { port: number }).port });
    const served = await took;
    const child = await spawnProcess('sh', ['-c', 'printf x'], { stdio: ['ignore', 'ignore', 'ignore'], socket: served });
    served.destroy();
    expect(await read(client, 1)).toBe('x');
    await new Promise<void>((resolve) => own.close(() => resolve()));
    if (child.exitCode === null) await once(child, 'exit');
    client.destroy();
  });

  it("shares the socket through Node's spawn when there is no helper (CANTO_AGENT_SPAWN_HELPER=off)", async () => {
    const got = await runWithoutSpawner<{ helper: unknown; ppid: number; self: number }>(dir, 'fallback', `import { connect, createServer } from 'node:net';
      import { spawnProcess, runningSpawner } from ${SPAWNER};
      const server = createServer(async (served) => {
        const child = await spawnProcess('sh', ['-c', 'printf "$PPID"'], { stdio: ['ignore', 'ignore', 'ignore'], socket: served });
        served.destroy();
        child.on('exit', () => server.close());
      });
      server.listen(0, '127.0.0.1', () => {
        const client = connect({ port: server.address().port, host: '127.0.0.1' });
        let got = '';
        client.on('data', (c) => (got += c));
        client.on('end', async () => console.log(JSON.stringify({ helper: await runningSpawner(), ppid: Number(got), self: process.pid })));
      });`);
    expect(got.helper).toBeNull();
    expect(got.ppid).toBe(got.self);
  });
});
