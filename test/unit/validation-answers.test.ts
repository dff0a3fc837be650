/**
 * What a request that fails its schema is told, on the real Fastify app (validation runs before
 * any service, so none is needed): the field, and what it may be — the allowed values of a union
 * of literals, the known members next to an unknown one, and for input actions the branch their
 * `type` names rather than whatever a mouse move would have needed.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp, type App, type AppDeps } from '../../scheduler/src/http/app.js';
import { silentLogger } from '../../shared/src/log.js';
import { SchedulerMetrics } from '../../scheduler/src/observability/metrics.js';

let app: App;

beforeAll(async () => {
  const unused = new Proxy({}, { get: () => () => Promise.reject(new Error('no service in this test')) });
  app = await buildApp({
    logger: silentLogger(),
    authenticate: async () => 'org_test',
    metrics: new SchedulerMetrics(),
    notReady: async () => null,
    waitCapMs: 1000,
    desktops: unused, lifecycle: unused, waiter: unused, usage: unused, guest: unused, webhooks: unused, ports: unused, keys: unused,
  } as unknown as AppDeps);
});

afterAll(async () => {
  await app?.close();
});

async function answer(url: string, payload: unknown, method: 'POST' | 'PATCH' = 'POST') {
  const res = await app.inject({ method, url, payload: payload as object, headers: { authorization: 'Bearer x' } });
  expect(res.statusCode, res.body).toBe(400);
  expect(res.headers['content-type']).toMatch(/^application\/problem\+json/);
  const body = res.json() as { detail: string; errors: Array<{ field: string; message: string }> };
  expect(body.detail).toBe(`${body.errors[0]!.field} ${body.errors[0]!.message}`);
  return body.errors[0]!;
}

const INPUT = '/v1/desktops/dsk_1335j5jcpm8gnmpr31r7m51a/input';
const ACTION_TYPES = '"mouse_move", "click", "button_press", "button_release", "drag", "scroll", "type", "key", "wait"';

describe('input actions', () => {
  it('name the action types when the type is unknown or missing', async () => {
    expect(await answer(INPUT, { actions: [{ type: 'hover' }] })).toEqual({ field: 'body/actions/0/type', message: `must be one of ${ACTION_TYPES}` });
    expect(await answer(INPUT, { actions: [{ combo: 'a' }] })).toEqual({ field: 'body/actions/0/type', message: `must be one of ${ACTION_TYPES}` });
  });

  it('are judged against the branch their type names', async () => {
    expect(await answer(INPUT, { actions: [{ type: 'key', combo: 'a', repeat: 2 }] })).toEqual({
      field: 'body/actions/0/repeat',
      message: 'is not a known member; known: type, combo',
    });
    expect(await answer(INPUT, { actions: [{ type: 'key' }] })).toEqual({ field: 'body/actions/0/combo', message: 'is required' });
    expect(await answer(INPUT, { actions: [{ type: 'click', button: 'top' }] })).toEqual({
      field: 'body/actions/0/button',
      message: 'must be one of "left", "middle", "right"',
    });
    expect(await answer(INPUT, { actions: [5] })).toEqual({ field: 'body/actions/0', message: 'must be object' });
  });
});

describe('unknown members', () => {
  it('are named with the members the body knows', async () => {
    expect(await answer('/v1/desktops', { tier: 'small', idle_timout_secs: 60 })).toEqual({
      field: 'body/idle_timout_secs',
      message: 'is not a known member; known: tier, billing_mode, image_version, idle_timeout_secs, env, setup_script',
    });
    const screenshot = await answer('/v1/desktops/dsk_1335j5jcpm8gnmpr31r7m51a/screenshot', { region: { x: 0, y: 0, width: 1, height: 1, w: 1 } });
    expect(screenshot).toEqual({ field: 'body/region/w', message: 'is not a known member; known: x, y, width, height' });
  });
});
