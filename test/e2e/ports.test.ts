/**
 * Port exposures end to end (docs/api.md §4.7): a real HTTP and WebSocket app inside a real sandbox
 * desktop, reached through the scheduler's ingress, the agent's port gateway and the forwarder
 * in the desktop's network namespace. Tokens in the query and in a header, none, another
 * exposure's; `Authorization` reaching the app unchanged; a WebSocket echo; hibernate → 503 and
 * wake → working again (the app is restored from the memory snapshot); delete → 404.
 */
import { createHash, randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { request } from 'node:http';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { api, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { startSandboxAgent, type SandboxAgent } from '../helpers/agent.js';
import { expectProblem } from '../helpers/problem.js';

const isRoot = process.getuid?.() === 0;
const APP = readFileSync(join(import.meta.dirname, '..', 'fixtures', 'guest-echo-app.mjs'));

interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: Buffer;
}

describe.skipIf(!isRoot)('port exposures through the ingress, on a real sandbox desktop', () => {
  let scheduler: TestScheduler;
  let agent: SandboxAgent;
  let call: ReturnType<typeof api>;
  let key: string;
  let id: string;
  let ingress: URL;
  let token: string;
  let host: string;

  /** A request to the ingress with the Host header of an exposure. */
  function viaIngress(path: string, options: { host?: string; headers?: Record<string, string>; method?: string; body?: Buffer } = {}): Promise<Answer> {
    return new Promise((resolve, reject) => {
      const req = request(
        {
          host: ingress.hostname,
          port: ingress.port,
          path,
          method: options.method ?? 'GET',
          headers: { host: options.host ?? host, ...options.headers },
          // A connection per request: deleting an exposure closes the connections it carried.
          agent: false,
        },
        (res) => {
          const parts: Buffer[] = [];
          res.on('data', (c: Buffer) => parts.push(c));
          res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(parts) }));
          res.on('error', reject);
        },
      );
      req.on('error', reject);
      req.end(options.body);
    });
  }

  beforeAll(async () => {
    scheduler = await startTestScheduler({ CANTO_INGRESS_BASE_URL: 'http://apps.canto.test', CANTO_INGRESS_LISTEN: '127.0.0.1:0' });
    expect(scheduler.ingressUrl).not.toBeNull();
    ingress = new URL(scheduler.ingressUrl!);
    agent = await startSandboxAgent(scheduler.url);
    key = await mintKey(scheduler.databaseUrl, 'ports-e2e');
    call = api(scheduler.url, key);
    id = (await call('POST', '/v1/desktops', { tier: 'small' })).json.id;
    expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).json.state).toBe('succeeded');
    const put = await fetch(`${scheduler.url}/v1/desktops/${id}/files/root/app.mjs`, { method: 'PUT', headers: { authorization: `Bearer ${key}` }, body: APP });
    expect(put.status).toBe(204);
    // Started by a plain exec, not detached: it is part of the desktop and survives hibernate.
    const started = await call('POST', `/v1/desktops/${id}/exec`, { command: 'setsid node /root/app.mjs 8000 >/root/app.log 2>&1 </dev/null &' });
    expect(started.json.exit_code, started.text).toBe(0);
    await until(async () => (await call('POST', `/v1/desktops/${id}/exec`, { command: 'grep -q listening /root/app.log' })).json.exit_code === 0, 10_000, 'the app to listen');
  }, 60_000);

  afterAll(async () => {
    await agent?.stop();
    await scheduler?.close();
  });

  it('exposes a private port: the token opens it, in the query or a header, and nothing else does', async () => {
    const created = await call('POST', `/v1/desktops/${id}/ports`, { port: 8000 });
    expect(created.status, created.text).toBe(201);
    expect(created.json).toMatchObject({ port: 8000, public: false, status: 'bound', url: `http://8000-${id}.apps.canto.test` });
    token = created.json.token;
    expect(token).toMatch(/^svc_pt_/);
    host = `8000-${id}.apps.canto.test`;
    const listed = await call('GET', `/v1/desktops/${id}/ports`);
    expect(listed.json.ports).toHaveLength(1);
    expect(listed.json.ports[0]).not.toHaveProperty('token');

    const byQuery = await viaIngress(`/hello?a=1&svc_token=${token}&b=2`, { headers: { authorization: 'Bearer app-own-credential' } });
    expect(byQuery.status).toBe(200);
    const seen = JSON.parse(byQuery.body.toString());
    expect(seen.url).toBe('/hello?a=1&b=2');
    expect(seen.headers.authorization).toBe('Bearer app-own-credential');
    expect(seen.headers.host).toBe(host);

    const byHeader = await viaIngress('/h', { headers: { 'x-svc-token': token } });
    expect(byHeader.status).toBe(200);
    expect(JSON.parse(byHeader.body.toString()).headers).not.toHaveProperty('x-svc-token');

    expect((await viaIngress('/none')).status).toBe(401);
    const other = await call('POST', `/v1/desktops/${id}/ports`, { port: 8001 });
    expect(other.status).toBe(201);
    expect((await viaIngress(`/x?svc_token=${other.json.token}`)).status).toBe(401);
    // Nothing listens on 8001 in the guest: the exposure exists, the app does not.
    expect((await viaIngress(`/x?svc_token=${other.json.token}`, { host: `8001-${id}.apps.canto.test` })).status).toBe(502);
    expectProblem(await call('POST', `/v1/desktops/${id}/ports`, { port: 8000 }), 409, 'exposed twice');
  }, 30_000);

  it('streams large bodies both ways and proxies a WebSocket', async () => {
    const upload = randomBytes(20 * 1024 * 1024);
    const echoed = await viaIngress('/upload', { method: 'POST', body: upload, headers: { 'x-svc-token': token, 'content-length': String(upload.length) } });
    expect(JSON.parse(echoed.body.toString())).toMatchObject({ bytes: upload.length, sha256: createHash('sha256').update(upload).digest('hex') });
    const big = await viaIngress(`/big?mb=32&svc_token=${token}`);
    expect(big.status).toBe(200);
    expect(big.body.length).toBe(32 * 1024 * 1024);

    const ws = new WebSocket(`ws://${ingress.host}/socket?svc_token=${token}`, { headers: { host } });
    const message = `hello ${'x'.repeat(100_000)}`;
    const reply = await new Promise<string>((resolve, reject) => {
      ws.once('open', () => ws.send(message));
      ws.once('message', (data) => resolve(data.toString()));
      ws.once('error', reject);
    });
    expect(reply).toBe(message);
    ws.close();
  }, 60_000);

  it('answers 503 while the desktop hibernates and works again after the wake', async () => {
    expect((await call('POST', `/v1/desktops/${id}/hibernate?wait=true`)).json.state).toBe('succeeded');
    expect((await call('GET', `/v1/desktops/${id}/ports`)).json.ports.map((p: { status: string }) => p.status)).toEqual(['unbound', 'unbound']);
    const down = await viaIngress(`/x?svc_token=${token}`);
    expect(down.status).toBe(503);
    const woke = (await call('POST', `/v1/desktops/${id}/wake?wait=true`)).json;
    expect(woke.state).toBe('succeeded');
    if (!woke.result.restored) {
      // No memory snapshot on this host: the wake was a cold boot, so the app starts again.
      await call('POST', `/v1/desktops/${id}/exec`, { command: 'rm -f /root/app.log; setsid node /root/app.mjs 8000 >/root/app.log 2>&1 </dev/null &' });
    }
    const up = await until(async () => {
      const res = await viaIngress(`/again?svc_token=${token}`);
      return res.status === 200 ? res : null;
    }, 10_000, 'the exposure to work after the wake');
    expect(JSON.parse(up.body.toString()).url).toBe('/again');
  }, 60_000);

  it('answers 404 for ever once the exposure is deleted', async () => {
    const removed = await fetch(`${scheduler.url}/v1/desktops/${id}/ports/8000`, { method: 'DELETE', headers: { authorization: `Bearer ${key}` } });
    expect(removed.status).toBe(204);
    expect((await viaIngress(`/x?svc_token=${token}`)).status).toBe(404);
    expectProblem(await call('DELETE', `/v1/desktops/${id}/ports/8000`), 404);
  });
});
