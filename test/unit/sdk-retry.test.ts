/**
 * The SDK's retries against a local HTTP server that answers 503/429 as scripted: which requests
 * are repeated (safe methods and those carrying an Idempotency-Key, never a one-shot stream),
 * how long it waits (the Retry-After it was given, or backoff), that attempts are bounded, and
 * that what remains is thrown as a typed problem. Waits are recorded, not slept.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import {
  CantoConnectionError, CantoProblem, ConflictProblem, NotFoundProblem, RateLimitedProblem, UnavailableProblem, createCanto, retryDelayMs, type Canto,
} from '../../sdk/src/index.js';

interface Seen {
  method: string;
  url: string;
  key: string | undefined;
  body: string;
}

let server: Server;
let base: string;
let seen: Seen[];
/** Answers for the next requests, in order; when empty, 200 `{}`. */
let script: Array<(res: ServerResponse) => void>;
let waits: number[];

const problem = (status: number, headers: Record<string, string> = {}, extra: object = {}) => (res: ServerResponse) => {
  res.writeHead(status, { 'content-type': 'application/problem+json', ...headers });
  res.end(JSON.stringify({ type: 'about:blank', title: 'T', status, detail: `detail ${status}`, ...extra }));
};

/** The request reached the server, which acted on it, and the answer was lost on the way. */
const cutOff = (res: ServerResponse) => void res.socket!.destroy();
const bytes = (text: string) => (res: ServerResponse) => void res.writeHead(200, { 'content-type': 'application/octet-stream' }).end(text);

function client(maxAttempts = 4): Canto {
  return createCanto({
    baseUrl: base,
    apiKey: 'svc_sk_test',
    retry: { maxAttempts, sleep: async (ms) => void waits.push(ms) },
  });
}

beforeAll(async () => {
  server = createServer(async (req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    seen.push({ method: req.method!, url: req.url!, key: req.headers['idempotency-key'] as string | undefined, body: Buffer.concat(chunks).toString() });
    const next = script.shift();
    if (next) return next(res);
    res.writeHead(req.method === 'PUT' ? 204 : 200, { 'content-type': 'application/json' });
    res.end(req.method === 'PUT' ? undefined : JSON.stringify({ id: 'op_1', state: 'pending', desktops: [] }));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  await new Promise((resolve) => server.close(resolve));
});

beforeEach(() => {
  seen = [];
  script = [];
  waits = [];
});

describe('SDK retries', () => {
  it('repeats a GET after 503 with Retry-After, waiting what the header says', async () => {
    script = [problem(503, { 'retry-after': '1' }), problem(503, { 'retry-after': '2' })];
    expect(await client().listDesktops()).toEqual([]);
    expect(seen.length).toBe(3);
    expect(waits).toEqual([1000, 2000]);
  });

  it('reads Retry-After as an HTTP date too, and honours it on 429', async () => {
    const inThreeSecs = new Date(Date.now() + 3000).toUTCString();
    script = [problem(429, { 'retry-after': inThreeSecs })];
    await client().listDesktops();
    expect(seen.length).toBe(2);
    expect(waits[0]).toBeGreaterThan(1000);
    expect(waits[0]).toBeLessThanOrEqual(3000);
  });

  it('backs off exponentially with jitter when no Retry-After is given', async () => {
    script = [problem(503), problem(503), problem(503)];
    await client().listDesktops();
    expect(waits.length).toBe(3);
    expect(waits[0]).toBeGreaterThanOrEqual(125);
    expect(waits[0]).toBeLessThanOrEqual(250);
    expect(waits[2]).toBeGreaterThanOrEqual(500);
    expect(waits[2]).toBeLessThanOrEqual(1000);
    expect(retryDelayMs(20, null, { maxDelayMs: 4000 }, () => 1)).toBe(4000);
  });

  it('gives up after maxAttempts and throws the last answer as a typed problem', async () => {
    script = Array.from({ length: 10 }, () => problem(503, { 'retry-after': '1' }));
    const err = await client(3).listDesktops().catch((e: unknown) => e);
    expect(seen.length).toBe(3);
    expect(err).toBeInstanceOf(UnavailableProblem);
    expect(err).toBeInstanceOf(CantoProblem);
    expect(err).toMatchObject({ status: 503, kind: 'unavailable', detail: 'detail 503', retryAfterSecs: 1, retryable: true, method: 'GET', path: '/v1/desktops' });
  });

  it('does not wait longer than maxRetryAfterMs: it hands the 429 back instead', async () => {
    script = [problem(429, { 'retry-after': '3600' })];
    const err = await client().listDesktops().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(RateLimitedProblem);
    expect(seen.length).toBe(1);
  });

  it('never repeats a POST without an Idempotency-Key (exec)', async () => {
    script = [problem(503, { 'retry-after': '1' })];
    const err = await client().exec('dsk_x', 'true').catch((e: unknown) => e);
    expect(err).toBeInstanceOf(UnavailableProblem);
    expect(seen.length).toBe(1);
  });

  it('repeats lifecycle calls, which always carry one Idempotency-Key for every attempt', async () => {
    script = [problem(503, { 'retry-after': '1' })];
    await client().wake('dsk_x');
    expect(seen.map((s) => s.url)).toEqual(['/v1/desktops/dsk_x/wake', '/v1/desktops/dsk_x/wake']);
    expect(seen[0]!.key).toMatch(/^[0-9a-f-]{36}$/);
    expect(seen[1]!.key).toBe(seen[0]!.key);
    await client().createDesktop({ tier: 'small' }, { idempotencyKey: 'mine-1' });
    expect(seen[2]!.key).toBe('mine-1');
    expect(JSON.parse(seen[2]!.body)).toEqual({ tier: 'small' });
  });

  it('repeats a buffered upload with the same bytes, but sends a stream only once', async () => {
    script = [problem(503, { 'retry-after': '1' })];
    await client().files.upload('dsk_x', '/root/a b.txt', Buffer.from('hello'));
    expect(seen.map((s) => [s.method, s.url, s.body])).toEqual([
      ['PUT', '/v1/desktops/dsk_x/files/root/a%20b.txt', 'hello'],
      ['PUT', '/v1/desktops/dsk_x/files/root/a%20b.txt', 'hello'],
    ]);
    seen = [];
    script = [problem(503, { 'retry-after': '1' })];
    const err = await client().files.upload('dsk_x', 'root/s.txt', Readable.from([Buffer.from('str'), Buffer.from('eam')])).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(UnavailableProblem);
    expect(seen.map((s) => s.body)).toEqual(['stream']);
    await client().files.upload('dsk_x', 'root/s.txt', Readable.from([Buffer.from('str'), Buffer.from('eam')]), { appendAt: 5 });
    expect(seen[1]).toMatchObject({ url: '/v1/desktops/dsk_x/files/root/s.txt?append=true&offset=5', body: 'stream' });
  });

  it('never repeats a POST whose Idempotency-Key the server does not keep (exec with a key of the caller)', async () => {
    script = [problem(503, { 'retry-after': '1' })];
    const err = await client()
      .api.POST('/v1/desktops/{id}/exec', { params: { path: { id: 'dsk_x' } }, body: { command: 'true' }, headers: { 'idempotency-key': 'k1' } })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(UnavailableProblem);
    expect(seen.length).toBe(1);
  });

  it('takes an append cut off mid-answer, whose repeat finds its own bytes at its offset, for done', async () => {
    script = [cutOff, problem(409, {}, { currentSize: 10 }), bytes('hello')];
    await client().files.upload('dsk_x', 'root/log', 'hello', { appendAt: 5 });
    expect(seen.map((s) => [s.method, s.url])).toEqual([
      ['PUT', '/v1/desktops/dsk_x/files/root/log?append=true&offset=5'],
      ['PUT', '/v1/desktops/dsk_x/files/root/log?append=true&offset=5'],
      ['GET', '/v1/desktops/dsk_x/files/root/log?offset=5&length=5'],
    ]);
  });

  it('still answers the 409 of an append when the bytes there are not its own, or no attempt before could have written', async () => {
    script = [cutOff, problem(409, {}, { currentSize: 10 }), bytes('other')];
    await expect(client().files.upload('dsk_x', 'root/log', 'hello', { appendAt: 5 })).rejects.toBeInstanceOf(ConflictProblem);
    seen = [];
    script = [problem(409, {}, { currentSize: 10 })];
    await expect(client().files.upload('dsk_x', 'root/log', 'hello', { appendAt: 5 })).rejects.toBeInstanceOf(ConflictProblem);
    expect(seen.length).toBe(1);
  });

  it('takes a delete cut off mid-answer, whose repeat finds nothing, for done; a first 404 stands', async () => {
    script = [cutOff, problem(404)];
    await client().files.remove('dsk_x', 'root/gone.txt');
    expect(seen.map((s) => s.method)).toEqual(['DELETE', 'DELETE']);
    script = [problem(404)];
    await expect(client().files.remove('dsk_x', 'root/gone.txt')).rejects.toBeInstanceOf(NotFoundProblem);
  });

  it('maps statuses to problem classes and keeps extension members', async () => {
    script = [problem(404), problem(409, {}, { currentSize: 7 })];
    await expect(client().getDesktop('dsk_x')).rejects.toBeInstanceOf(NotFoundProblem);
    const err = (await client().getDesktop('dsk_x').catch((e: unknown) => e)) as ConflictProblem;
    expect(err).toBeInstanceOf(ConflictProblem);
    expect(err.body.currentSize).toBe(7);
    expect(err.retryable).toBe(false);
  });

  it('turns a refused connection into CantoConnectionError after its retries', async () => {
    const closed = createServer();
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
    const port = (closed.address() as AddressInfo).port;
    await new Promise((resolve) => closed.close(resolve));
    const sdk = createCanto({ baseUrl: `http://127.0.0.1:${port}`, apiKey: 'k', retry: { maxAttempts: 2, sleep: async (ms) => void waits.push(ms) } });
    const err = await sdk.listDesktops().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(CantoConnectionError);
    expect((err as CantoConnectionError).code).toBe('ECONNREFUSED');
    expect(waits.length).toBe(1);
    // A keyed call's error names the key it was sent with, so the caller's own retry repeats it.
    const create = (await sdk.createDesktop({ tier: 'small' }).catch((e: unknown) => e)) as CantoConnectionError;
    expect(create).toBeInstanceOf(CantoConnectionError);
    expect(create.idempotencyKey).toMatch(/^[0-9a-f-]{36}$/);
    const wake = (await sdk.wake('dsk_x', { idempotencyKey: 'mine-2' }).catch((e: unknown) => e)) as CantoConnectionError;
    expect(wake.idempotencyKey).toBe('mine-2');
  });
});
