/**
 * One delivery attempt over real loopback sockets: what is sent, what comes back, and how each
 * kind of failure is reported (timeouts, refused connections, redirects, TLS verification, the
 * address guard, a dispatcher that stops mid-attempt).
 */
import { execFileSync } from 'node:child_process';
import { createSocket } from 'node:dgram';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer as createHttpServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { postDelivery, USER_AGENT } from '../../scheduler/src/webhooks/post-attempt.js';
import { dnsLookup } from '../../scheduler/src/webhooks/guarded-connect.js';
import { HostsFile } from '../../scheduler/src/webhooks/hosts-file.js';
import { freePort } from '../helpers/processes.js';

const dev = { allowLoopback: true, hosts: {} };
const BODY = '{"type":"desktop.created","desktopId":"dsk_x","data":{}}';
const SVC = { 'Svc-Webhook-Id': 'dlv_test', 'Svc-Webhook-Event': 'desktop.created', 'Svc-Signature': 't=1,v1=00' };

let server: Server;
let origin: string;
const seen: Array<{ req: IncomingMessage; body: string }> = [];
const hanging: ServerResponse[] = [];

beforeAll(async () => {
  server = createHttpServer((req, res) => {
    let body = '';
    req.on('data', (c: Buffer) => (body += c.toString()));
    req.on('end', () => {
      seen.push({ req, body });
      if (req.url === '/hang') return void hanging.push(res);
      if (req.url === '/redirect') return void res.writeHead(307, { location: '/elsewhere' }).end();
      if (req.url === '/big') return void res.writeHead(200).end(Buffer.alloc(1024 * 1024));
      res.writeHead(req.url === '/fail' ? 500 : 204).end();
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  origin = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
});

afterAll(async () => {
  for (const res of hanging) res.destroy();
  server.closeAllConnections();
  await new Promise<void>((r) => server.close(() => r()));
});

describe('postDelivery', () => {
  it('POSTs the body with the Svc headers, JSON type, a fresh connection and the URL host', async () => {
    const result = await postDelivery({ url: `${origin}/ok?x=1`, body: BODY, headers: SVC }, { policy: dev, timeoutMs: 2000 });
    expect(result).toEqual({ kind: 'response', status: 204 });
    const { req, body } = seen.at(-1)!;
    expect(body).toBe(BODY);
    expect(req.method).toBe('POST');
    expect(req.url).toBe('/ok?x=1');
    expect(req.headers).toMatchObject({
      host: origin.slice('http://'.length),
      'content-type': 'application/json',
      'content-length': String(Buffer.byteLength(BODY)),
      'user-agent': USER_AGENT,
      connection: 'close',
      'svc-webhook-id': 'dlv_test',
      'svc-webhook-event': 'desktop.created',
      'svc-signature': 't=1,v1=00',
    });
  });

  it('reports non-2xx statuses, does not follow redirects, and copes with a large answer', async () => {
    expect(await postDelivery({ url: `${origin}/fail`, body: BODY, headers: SVC }, { policy: dev, timeoutMs: 2000 })).toEqual({ kind: 'response', status: 500 });
    const before = seen.length;
    expect(await postDelivery({ url: `${origin}/redirect`, body: BODY, headers: SVC }, { policy: dev, timeoutMs: 2000 })).toEqual({ kind: 'response', status: 307 });
    expect(seen.slice(before).map((s) => s.req.url)).toEqual(['/redirect']);
    expect(await postDelivery({ url: `${origin}/big`, body: BODY, headers: SVC }, { policy: dev, timeoutMs: 2000 })).toEqual({ kind: 'response', status: 200 });
  });

  it('times out a receiver that never answers', async () => {
    const started = Date.now();
    const result = await postDelivery({ url: `${origin}/hang`, body: BODY, headers: SVC }, { policy: dev, timeoutMs: 300 });
    expect(result).toEqual({ kind: 'error', message: 'no response within 300 ms', permanent: false });
    expect(Date.now() - started).toBeLessThan(2000);
  });

  it('reports a refused connection as retryable', async () => {
    const port = await freePort();
    expect(await postDelivery({ url: `http://127.0.0.1:${port}/`, body: BODY, headers: SVC }, { policy: dev, timeoutMs: 2000 })).toEqual({
      kind: 'error',
      message: 'connection refused',
      permanent: false,
    });
  });

  it('refuses loopback and plain http for good without the opt-in, before connecting', async () => {
    const before = seen.length;
    const strict = { allowLoopback: false, hosts: {} };
    expect(await postDelivery({ url: `${origin}/ok`, body: BODY, headers: SVC }, { policy: strict, timeoutMs: 2000 })).toMatchObject({ kind: 'error', permanent: true, message: /^refused: plain http/ });
    const https = `https://127.0.0.1:${origin.split(':')[2]}/ok`;
    expect(await postDelivery({ url: https, body: BODY, headers: SVC }, { policy: strict, timeoutMs: 2000 })).toMatchObject({ kind: 'error', permanent: true, message: /^refused: .*loopback/ });
    expect(seen.length).toBe(before);
  });

  it('bounds a resolver that never answers by the attempt timeout', async () => {
    const silent = { ...dev, lookup: () => new Promise<string[]>(() => {}) };
    const attempt = postDelivery({ url: 'http://hooks.example.test/x', body: BODY, headers: SVC }, { policy: silent, timeoutMs: 300 });
    const hung = new Promise((resolve) => setTimeout(() => resolve('still resolving'), 3_000).unref());
    expect(await Promise.race([attempt, hung])).toEqual({ kind: 'error', message: 'no response within 300 ms', permanent: false });
  });

  it('asks DNS without the thread pool, and gives up on a name server that never answers when told to', async () => {
    // A name server that reads every query and answers none.
    const server = createSocket('udp4');
    await new Promise<void>((r) => server.bind(0, '127.0.0.1', r));
    try {
      const servers = [`127.0.0.1:${server.address().port}`];
      const started = performance.now();
      const stop = new AbortController();
      setTimeout(() => stop.abort(new Error('attempt over')), 200);
      await expect(dnsLookup('hooks.example.test', stop.signal, servers)).rejects.toThrow('attempt over');
      expect(performance.now() - started).toBeLessThan(1_500);
    } finally {
      server.close();
    }
  });

  it('reads a hosts file before DNS, as getaddrinfo would', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'canto-hosts-'));
    try {
      writeFileSync(join(dir, 'hosts'), '127.0.0.1 localhost\n# a comment\n203.0.113.5 Receiver.Internal receiver # trailing\n2001:db8::5 receiver.internal\nnot-an-ip bogus\n');
      const file = new HostsFile(join(dir, 'hosts'));
      const never = new AbortController().signal;
      expect(await dnsLookup('RECEIVER.internal.', never, ['127.0.0.1:1'], file)).toEqual(['203.0.113.5', '2001:db8::5']);
      expect(await dnsLookup('receiver', never, ['127.0.0.1:1'], file)).toEqual(['203.0.113.5']);
      expect(await file.lookup('bogus')).toEqual([]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('answers aborted, and records nothing, when the dispatcher stops mid-attempt', async () => {
    const stop = new AbortController();
    const pending = postDelivery({ url: `${origin}/hang`, body: BODY, headers: SVC }, { policy: dev, timeoutMs: 5000, signal: stop.signal });
    setTimeout(() => stop.abort(), 100);
    expect(await pending).toEqual({ kind: 'aborted' });
  });
});

describe.skipIf(!hasOpenssl())('postDelivery over TLS', () => {
  let dir: string;
  let tlsServer: ReturnType<typeof createHttpsServer>;
  let port: number;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'canto-webhook-tls-'));
    execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', join(dir, 'key.pem'), '-out', join(dir, 'cert.pem'),
      '-days', '1', '-subj', '/CN=localhost', '-addext', 'subjectAltName=IP:127.0.0.1,DNS:localhost'], { stdio: 'ignore' });
    tlsServer = createHttpsServer({ key: readFileSync(join(dir, 'key.pem')), cert: readFileSync(join(dir, 'cert.pem')) }, (_req, res) => res.writeHead(200).end());
    await new Promise<void>((r) => tlsServer.listen(0, '127.0.0.1', r));
    port = (tlsServer.address() as { port: number }).port;
  });

  afterAll(async () => {
    tlsServer.closeAllConnections();
    await new Promise<void>((r) => tlsServer.close(() => r()));
    rmSync(dir, { recursive: true, force: true });
  });

  it('verifies the certificate: a self-signed one is not accepted', async () => {
    for (const host of ['127.0.0.1', 'localhost']) {
      const result = await postDelivery({ url: `https://${host}:${port}/`, body: BODY, headers: SVC }, { policy: dev, timeoutMs: 2000 });
      expect(result, host).toEqual({ kind: 'error', message: 'TLS certificate not accepted (DEPTH_ZERO_SELF_SIGNED_CERT)', permanent: false });
    }
  });
});

function hasOpenssl(): boolean {
  try {
    execFileSync('openssl', ['version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}
