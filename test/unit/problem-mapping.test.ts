/**
 * The HTTP error mapping, on the real Fastify app with services that fail on purpose: every
 * failure becomes problem+json, and a 500 never carries the underlying error's text.
 */
import { describe, expect, it, afterAll } from 'vitest';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { buildApp } from '../../scheduler/src/http/app.js';
import { ApiError } from '../../scheduler/src/errors.js';
import { silentLogger } from '../../shared/src/log.js';
import type { AppDeps } from '../../scheduler/src/http/app.js';
import { SchedulerMetrics } from '../../scheduler/src/observability/metrics.js';

const SECRET = 'password=hunter2 at db.internal:5432';

function throwingDeps(error: Error, logger = silentLogger()): AppDeps {
  const fail = async () => {
    throw error;
  };
  return {
    logger,
    authenticate: async () => 'org_test',
    desktops: { listBody: fail, create: fail, get: fail, patch: fail } as unknown as AppDeps['desktops'],
    lifecycle: { request: fail, get: fail } as unknown as AppDeps['lifecycle'],
    waiter: { wait: fail } as unknown as AppDeps['waiter'],
    usage: { report: fail } as unknown as AppDeps['usage'],
    guest: { exec: fail, spawn: fail, processStatus: fail, readFile: fail, writeFile: fail, deletePath: fail, stat: fail, listDir: fail } as unknown as AppDeps['guest'],
    webhooks: { create: fail, list: fail, remove: fail, deliveries: fail } as unknown as AppDeps['webhooks'],
    ports: { list: fail, create: fail, remove: fail } as unknown as AppDeps['ports'],
    keys: { create: fail, list: fail, revoke: fail } as unknown as AppDeps['keys'],
    waitCapMs: 1000,
    metrics: new SchedulerMetrics(),
    notReady: async () => null,
  };
}

describe('problem mapping', () => {
  const apps: Array<{ close(): Promise<unknown> }> = [];
  afterAll(async () => {
    for (const app of apps) await app.close();
  });

  it('hides the text of unexpected errors behind a 500 that names the request, as its log line does', async () => {
    const lines: Array<Record<string, unknown>> = [];
    const sink = new Writable({
      write(chunk: Buffer, _enc, done) {
        lines.push(JSON.parse(chunk.toString()) as Record<string, unknown>);
        done();
      },
    });
    const app = await buildApp(throwingDeps(new Error(SECRET), pino({ level: 'info' }, sink)));
    apps.push(app);
    const res = await app.inject({ method: 'GET', url: '/v1/desktops?state=awake', headers: { authorization: 'Bearer x', 'request-id': 'chosen-by-client' } });
    expect(res.statusCode).toBe(500);
    expect(res.headers['content-type']).toContain('application/problem+json');
    const body = res.json();
    expect(body.request_id).toMatch(/^req_[A-Za-z0-9_-]{12}$/);
    expect(body).toEqual({
      type: 'about:blank',
      title: 'Internal Server Error',
      status: 500,
      detail: `internal error; quote request ${body.request_id} when reporting it`,
      request_id: body.request_id,
    });
    expect(res.body).not.toContain('hunter2');
    const logged = lines.find((l) => l.msg === 'request failed');
    expect(logged).toMatchObject({ reqId: body.request_id, route: '/v1/desktops', method: 'GET' });
    expect(JSON.stringify(logged)).toContain('hunter2');
    // Two requests, two ids.
    const again = await app.inject({ method: 'GET', url: '/v1/desktops', headers: { authorization: 'Bearer x' } });
    expect(again.json().request_id).not.toBe(body.request_id);
  });

  it("names the request on a guest's own 500 too", async () => {
    const app = await buildApp(throwingDeps(new ApiError(500, 'an input action failed inside the desktop')));
    apps.push(app);
    const res = await app.inject({ method: 'GET', url: '/v1/usage', headers: { authorization: 'Bearer x' } });
    expect(res.statusCode).toBe(500);
    expect(res.json()).toMatchObject({ status: 500, detail: 'an input action failed inside the desktop', request_id: expect.stringMatching(/^req_/) });
  });

  it('passes ApiError status, detail, extension members and headers through', async () => {
    const app = await buildApp(throwingDeps(new ApiError(409, 'nope', { operation_id: 'op_x', currentSize: 7 }, { 'retry-after': '3' })));
    apps.push(app);
    const res = await app.inject({ method: 'GET', url: '/v1/usage', headers: { authorization: 'Bearer x' } });
    expect(res.statusCode).toBe(409);
    expect(res.headers['retry-after']).toBe('3');
    expect(res.json()).toEqual({ type: 'about:blank', title: 'Conflict', status: 409, detail: 'nope', operation_id: 'op_x', currentSize: 7 });
  });
});
