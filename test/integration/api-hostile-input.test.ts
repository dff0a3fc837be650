/**
 * Hostile input gets a clear answer: problem+json with the right status, read by the client
 * (never a cut connection), naming what is wrong and echoing nothing of the request. Covers bodies
 * over the 2 MiB limit, bad percent-encoding in the path, malformed HTTP framing and headers, and
 * guest-bound input that can be refused before it reaches the guest.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { connect } from 'node:net';
import { request } from 'node:http';
import { api, mintKey, startTestScheduler, type TestScheduler } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { expectProblem } from '../helpers/problem.js';

let s: TestScheduler;
let agent: TestAgent;
let key: string;
let call: ReturnType<typeof api>;
let desktopId: string;

beforeAll(async () => {
  s = await startTestScheduler({ CANTO_INGRESS_BASE_URL: 'http://apps.hostile.test', CANTO_INGRESS_LISTEN: '127.0.0.1:0' });
  agent = await startFakeAgent(s.url);
  key = await mintKey(s.databaseUrl, 'hostile');
  call = api(s.url, key);
  desktopId = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id;
  expect((await call('POST', `/v1/desktops/${desktopId}/wake?wait=true`)).status).toBe(200);
});

afterAll(async () => {
  await agent?.stop();
  await s?.close();
});

/** Writes `raw` on a fresh connection and answers what comes back before the server closes it. */
function rawExchange(raw: string | Buffer, base = s.url): Promise<{ status: number; headers: string; body: string }> {
  const { hostname, port } = new URL(base);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), hostname);
    let data = '';
    socket.on('data', (c: Buffer) => (data += c.toString('latin1')));
    socket.on('error', reject);
    socket.on('end', () => socket.end());
    socket.on('close', () => {
      const [head = '', ...rest] = data.split('\r\n\r\n');
      resolve({ status: Number(/^HTTP\/1\.1 (\d{3})/.exec(head)?.[1] ?? 0), headers: head, body: rest.join('\r\n\r\n') });
    });
    socket.setTimeout(5_000, () => socket.destroy(new Error('no answer within 5 s')));
    socket.end(raw);
  });
}

function expectProblemBody(res: { status: number; headers: string; body: string }, status: number, what: string): void {
  expect(res.status, `${what}: ${res.headers}\n${res.body}`).toBe(status);
  expect(res.headers.toLowerCase(), what).toContain('content-type: application/problem+json');
  const body = JSON.parse(res.body) as { status: number; type: string; title: string; detail: string };
  expect(body).toMatchObject({ type: 'about:blank', status });
  expect(typeof body.detail).toBe('string');
}

describe('bodies over the limit', () => {
  it('answers 413 problem+json to a JSON body over 2 MiB, and the client reads it', async () => {
    const body = Buffer.from(JSON.stringify({ idle_timeout_secs: 1, pad: 'x'.repeat(24 * 1024 * 1024) }));
    const { hostname, port } = new URL(s.url);
    const res = await new Promise<{ status: number; type: string; text: string }>((resolve, reject) => {
      const req = request(
        { host: hostname, port, method: 'PATCH', path: `/v1/desktops/${desktopId}`, headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', 'content-length': body.length } },
        (r) => {
          let text = '';
          r.on('data', (c: Buffer) => (text += c.toString()));
          r.on('end', () => resolve({ status: r.statusCode ?? 0, type: String(r.headers['content-type']), text }));
        },
      );
      req.on('error', reject);
      req.end(body);
    });
    expect(res.status, res.text).toBe(413);
    expect(res.type).toMatch(/^application\/problem\+json/);
    expect(JSON.parse(res.text)).toMatchObject({ status: 413 });
    // The desktop was not changed by the refused body.
    expect((await call('GET', `/v1/desktops/${desktopId}`)).json.idle_timeout_secs).toBe(0);
  });
});

describe('the path', () => {
  it('answers 400 problem+json to percent-encoding that decodes to nothing, without echoing the path', async () => {
    for (const segment of ['%ff', '%zz', '%c0%af', '%']) {
      const res = await call('GET', `/v1/desktops/${segment}`);
      expectProblem(res, 400, segment);
      expect(res.text).not.toContain(segment);
    }
  });
});

describe('framing and headers', () => {
  const auth = `Authorization: Bearer ${key}\r\n`;
  it('answers malformed requests with problem+json', async () => {
    expectProblemBody(await rawExchange('GET /v1/desktops HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab'), 400, 'duplicate Content-Length');
    expectProblemBody(await rawExchange('GET /v1/desktops HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n'), 400, 'negative Content-Length');
    expectProblemBody(await rawExchange('POST /v1/desktops HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n'), 400, 'bad chunk size');
    expectProblemBody(await rawExchange(Buffer.from('GET /v1/desktops HTTP/1.1\r\nHost: x\r\nX-Bad: a\u0000b\r\n\r\n', 'latin1')), 400, 'NUL in a header');
    expectProblemBody(await rawExchange(`GET /v1/desktops HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20 * 1024)}\r\n\r\n`), 431, 'a 20 KiB header');
  });

  it('answers the same on the port ingress', async () => {
    expectProblemBody(await rawExchange('GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab', s.ingressUrl!), 400, 'ingress: duplicate Content-Length');
    expectProblemBody(await rawExchange(`GET / HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(20 * 1024)}\r\n\r\n`, s.ingressUrl!), 431, 'ingress: a 20 KiB header');
    expectProblemBody(await rawExchange('CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n', s.ingressUrl!), 405, 'ingress: CONNECT');
  });

  it("answers an Expect it cannot meet with 417 problem+json, on the API and on the ingress", async () => {
    expectProblemBody(await rawExchange(`GET /v1/desktops HTTP/1.1\r\nHost: x\r\n${auth}Expect: junk\r\n\r\n`), 417, 'Expect: junk');
    expectProblemBody(await rawExchange('GET / HTTP/1.1\r\nHost: x\r\nExpect: junk\r\n\r\n', s.ingressUrl!), 417, 'ingress: Expect: junk');
  });

  it('answers a request without a Host header with problem+json, on the API and on the ingress', async () => {
    const api = await rawExchange(`GET /v1/desktops HTTP/1.1\r\nAuthorization: Bearer ${key}\r\n\r\n`);
    expectProblemBody(api, 400, 'no Host');
    expect(JSON.parse(api.body).detail).toBe('the request has no Host header');
    expectProblemBody(await rawExchange('GET / HTTP/1.1\r\n\r\n', s.ingressUrl!), 400, 'ingress: no Host');
  });

  it('answers a client that half-closes its side after sending, even when the answer takes a database read', async () => {
    const res = await rawExchange(`GET /v1/desktops HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\n\r\n`);
    expect(res.status, res.headers).toBe(200);
    const absolute = await rawExchange(`GET http://elsewhere.example/v1/desktops/${desktopId} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\n\r\n`);
    expect(absolute.status, absolute.headers).toBe(200);
  });

  it('answers an unknown method and CONNECT with problem+json', async () => {
    expectProblemBody(await rawExchange(`BREW /v1/desktops HTTP/1.1\r\nHost: x\r\n${auth}\r\n`), 400, 'BREW');
    expectProblemBody(await rawExchange(`CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n`), 405, 'CONNECT');
  });
});

describe('validation answers', () => {
  it('name the field and the allowed values, in detail and in errors', async () => {
    const tier = await call('POST', '/v1/desktops', { tier: 'huge' });
    expectProblem(tier, 400);
    expect(tier.json.detail).toBe('body/tier must be one of "small", "default", "large"');
    expect(tier.json.errors).toEqual([{ field: 'body/tier', message: 'must be one of "small", "default", "large"' }]);
    const missing = await call('POST', '/v1/desktops', {});
    expect(missing.json.errors).toEqual([{ field: 'body/tier', message: 'is required' }]);
    const claim = await call('POST', `/v1/desktops/${desktopId}/stream`, { claim: 'own' });
    expect(claim.json.detail).toMatch(/^body\/claim must be one of "view", "control"/);
    const wait = await call('POST', `/v1/desktops/${desktopId}/hibernate?wait=maybe`);
    expectProblem(wait, 400);
    expect(wait.json.errors[0].field).toBe('querystring/wait');
  });
});

describe('unknown body members', () => {
  it('are refused with 400 naming the member and the known ones, on every body', async () => {
    const typo = await call('POST', '/v1/desktops', { tier: 'small', idle_timout_secs: 60 });
    expectProblem(typo, 400);
    expect(typo.json.errors).toEqual([{ field: 'body/idle_timout_secs', message: expect.stringMatching(/^is not a known member; known: tier, .*idle_timeout_secs/) }]);
    const bodies: Array<[string, string, unknown]> = [
      ['PATCH', `/v1/desktops/${desktopId}`, { idle_timeout_secs: 5, idle: 1 }],
      ['POST', `/v1/desktops/${desktopId}/wake`, { expected_gen: 1 }],
      ['POST', `/v1/desktops/${desktopId}/fork`, { count: 1, acknowledge_shared_state: true, ephemeral: false, name: 'x' }],
      ['POST', '/v1/webhooks', { url: 'https://example.com/h', events: ['desktop.awake'], secret: 'x' }],
      ['POST', '/v1/keys', { name: 'k', org: 'other' }],
      ['POST', `/v1/desktops/${desktopId}/ports`, { port: 8080, publik: true }],
      ['POST', `/v1/desktops/${desktopId}/exec`, { command: 'true', cwd: '/tmp' }],
      ['POST', `/v1/desktops/${desktopId}/screenshot`, { region: { x: 0, y: 0, width: 1, height: 1, w: 1 } }],
      ['POST', `/v1/desktops/${desktopId}/input`, { actions: [], mode: 'fast' }],
      ['POST', `/v1/desktops/${desktopId}/input`, { actions: [{ type: 'key', combo: 'a', repeat: 2 }] }],
      ['POST', `/v1/desktops/${desktopId}/stream`, { claim: 'view', ttl: 5 }],
      ['PUT', `/v1/desktops/${desktopId}/display`, { width: 800, height: 600, dpi: 96 }],
    ];
    for (const [method, path, body] of bodies) {
      const res = await call(method, path, body);
      expectProblem(res, 400, `${method} ${path} ${JSON.stringify(body)}`);
      expect(res.json.detail, `${method} ${path}`).toMatch(/is not a known member/);
    }
    // Nothing was changed by the refused PATCH.
    expect((await call('GET', `/v1/desktops/${desktopId}`)).json.idle_timeout_secs).toBe(0);
  });
});

describe('guest-bound input refused before the guest', () => {
  it('answers 400 naming the key when a combo holds no X key name', async () => {
    for (const combo of ['true', 'ctrl+return', 'XF86Bogus']) {
      const res = await call('POST', `/v1/desktops/${desktopId}/input`, { actions: [{ type: 'key', combo }] });
      expectProblem(res, 400, combo);
      expect(res.json.detail).toMatch(/^actions\[0\]\.combo: ".+" is not a key name/);
    }
  });

  it('answers 400 to env values and setup scripts that carry a NUL byte', async () => {
    const env = await call('POST', '/v1/desktops', { tier: 'small', env: { GOOD: 'a', BAD: 'a\u0000b' } });
    expectProblem(env, 400);
    expect(env.json.detail).toBe('body/env/BAD must not contain a NUL byte');
    expectProblem(await call('POST', '/v1/desktops', { tier: 'small', setup_script: 'echo\u0000' }), 400);
  });

  it('answers 400 naming the command when it carries a NUL byte', async () => {
    const res = await call('POST', `/v1/desktops/${desktopId}/exec`, { command: 'echo a\u0000b' });
    expectProblem(res, 400);
    expect(res.json.detail).toContain('command');
    const detached = await call('POST', `/v1/desktops/${desktopId}/exec`, { command: 'sleep 1\u0000', detached: true });
    expectProblem(detached, 400);
  });
});
