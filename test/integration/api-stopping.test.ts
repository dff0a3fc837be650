/**
 * A replica that is stopping answers what still reaches it on an open connection (a request
 * pipelined behind one in flight, or sent on a kept-alive connection as the stop began) with a
 * problem like every other refusal: 503, `Retry-After`, and `Connection: close`, so the client's
 * retry goes out on a new connection (to another replica behind a balancer).
 */
import { connect } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mintKey, startTestScheduler, type TestScheduler } from '../helpers/scheduler.js';

let scheduler: TestScheduler;
let key: string;

beforeAll(async () => {
  scheduler = await startTestScheduler();
  key = await mintKey(scheduler.databaseUrl, 'stopping');
});

afterAll(async () => {
  await scheduler?.close();
});

/** Everything the server sends on a raw connection until it closes it. */
function collect(socket: ReturnType<typeof connect>): Promise<string> {
  return new Promise((resolve, reject) => {
    let text = '';
    socket.on('data', (chunk: Buffer) => (text += chunk.toString('latin1')));
    socket.on('close', () => resolve(text));
    socket.on('error', reject);
  });
}

describe('a stopping replica', () => {
  it('answers a request that reaches it during the stop with a 503 problem, Retry-After and Connection: close', async () => {
    const url = new URL(scheduler.url);
    const socket = connect({ host: url.hostname, port: Number(url.port) });
    await new Promise((resolve, reject) => socket.once('connect', resolve).once('error', reject));
    const answers = collect(socket);
    const body = JSON.stringify({ tier: 'small' });
    // The first request is in flight (its body not yet sent) when the stop begins, so the
    // connection is not idle and stays open.
    socket.write(`POST /v1/desktops HTTP/1.1\r\nHost: ${url.host}\r\nAuthorization: Bearer ${key}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n`);
    await new Promise((r) => setTimeout(r, 100));
    const stopped = scheduler.close();
    await new Promise((r) => setTimeout(r, 100));
    // Its body, and a second request pipelined behind it.
    socket.write(`${body}GET /v1/desktops HTTP/1.1\r\nHost: ${url.host}\r\nAuthorization: Bearer ${key}\r\n\r\n`);
    const text = await answers;
    await stopped;

    const replies = text.split(/(?=HTTP\/1\.1 )/);
    expect(replies).toHaveLength(2);
    expect(replies[0]).toMatch(/^HTTP\/1\.1 201 /);
    const [head, payload] = replies[1]!.split('\r\n\r\n');
    expect(head).toMatch(/^HTTP\/1\.1 503 /);
    expect(head).toMatch(/\r\ncontent-type: application\/problem\+json/i);
    expect(head).toMatch(/\r\nretry-after: 1\r\n/i);
    expect(head).toMatch(/\r\nconnection: close\r\n/i);
    expect(JSON.parse(payload!)).toMatchObject({ type: 'about:blank', title: 'Service Unavailable', status: 503, detail: expect.stringContaining('stopping') });
  }, 30_000);
});
