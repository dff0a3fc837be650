/**
 * The computer-use routes' own rules (docs/api.md §4.5, 4.6, 8), fast, with a real scheduler and a real
 * agent on the FakeDriver: body validation and every batch cap answer 400 before any guest work,
 * binary and base64 screenshots carry the post-crop, post-scale size, a host without
 * computer-use support answers 501, and another org's desktop answers like a missing one. The
 * same routes against the real sandbox runtime are in test/e2e/computer-use.test.ts.
 */
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, mintKey, startTestScheduler, type TestScheduler, awakeDesktop } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { expectProblem } from '../helpers/problem.js';

let s: TestScheduler;
let agent: TestAgent;
let key: string;
let call: ReturnType<typeof api>;
let id: string;

beforeAll(async () => {
  s = await startTestScheduler();
  agent = await startFakeAgent(s.url);
  key = await mintKey(s.databaseUrl, 'computer-use');
  call = api(s.url, key);
  id = await awakeDesktop(call);
});

afterAll(async () => {
  await agent?.stop();
  await s?.close();
});

async function shoot(desktopId: string, body?: unknown): Promise<Response> {
  return fetch(`${s.url}/v1/desktops/${desktopId}/screenshot`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
}

describe('POST /v1/desktops/{id}/screenshot', () => {
  it('answers a PNG of the whole display for an empty body', async () => {
    const res = await shoot(id);
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('image/png');
    const meta = await sharp(Buffer.from(await res.arrayBuffer())).metadata();
    expect([meta.format, meta.width, meta.height]).toEqual(['png', 1024, 768]);
  });

  it('answers base64 JSON with the post-crop, post-scale size', async () => {
    const res = await call('POST', `/v1/desktops/${id}/screenshot`, {
      encoding: 'base64',
      region: { x: 100, y: 50, width: 400, height: 300 },
      scale_percent: 50,
    });
    expect(res.status).toBe(200);
    expect([res.json.width, res.json.height]).toEqual([200, 150]);
    const meta = await sharp(Buffer.from(res.json.data_base64, 'base64')).metadata();
    expect([meta.width, meta.height]).toEqual([200, 150]);
  });

  it('clamps a region reaching off the screen', async () => {
    const res = await call('POST', `/v1/desktops/${id}/screenshot`, { encoding: 'base64', region: { x: 1000, y: 700, width: 500, height: 500 } });
    expect([res.json.width, res.json.height]).toEqual([24, 68]);
    // Off the top and left edges as well: what is on the screen of it.
    const before = await call('POST', `/v1/desktops/${id}/screenshot`, { encoding: 'base64', region: { x: -10, y: -700, width: 30, height: 720 } });
    expect([before.json.width, before.json.height]).toEqual([20, 20]);
    const beyond = await call('POST', `/v1/desktops/${id}/screenshot`, { encoding: 'base64', region: { x: -50, y: 0, width: 30, height: 5 } });
    expect([beyond.json.width, beyond.json.height]).toEqual([1, 5]);
  });

  it('refuses a partial region, a bad scale and a bad encoding with 400', async () => {
    for (const body of [
      { region: { x: 0, y: 0, width: 10 } },
      { region: { x: 0, y: 0, width: 0, height: 10 } },
      { region: { x: -40000, y: 0, width: 10, height: 10 } },
      { scale_percent: 0 },
      { scale_percent: 101 },
      { scale_percent: 50.5 },
      { encoding: 'jpeg' },
    ]) {
      expectProblem(await call('POST', `/v1/desktops/${id}/screenshot`, body), 400, JSON.stringify(body));
    }
  });
});

describe('POST /v1/desktops/{id}/input', () => {
  it('returns the final cursor, and only the cursor for an empty batch', async () => {
    const moved = await call('POST', `/v1/desktops/${id}/input`, {
      actions: [{ type: 'mouse_move', x: 10, y: 20 }, { type: 'click', x: 300, y: 200, button: 'right', double: true }],
    });
    expect(moved.status, moved.text).toBe(200);
    expect(moved.json).toEqual({ cursor: { x: 300, y: 200 } });
    expect((await call('POST', `/v1/desktops/${id}/input`, { actions: [] })).json).toEqual({ cursor: { x: 300, y: 200 } });
  });

  it('accepts every action type at its limits', async () => {
    const res = await call('POST', `/v1/desktops/${id}/input`, {
      actions: [
        { type: 'button_press', button: 'left' },
        { type: 'button_release', button: 'left' },
        { type: 'drag', from: { x: 1, y: 2 }, to: { x: 40, y: 50 }, button: 'middle' },
        { type: 'drag', to: { x: 41, y: 51 } },
        { type: 'scroll', direction: 'down', amount: 50 },
        { type: 'scroll', direction: 'left' },
        { type: 'type', text: 'é'.repeat(4096), delay_ms: 0 },
        { type: 'type', text: 'x', delay_ms: 500 },
        { type: 'key', combo: 'ctrl+shift+alt+super+a+b+c+d' },
        { type: 'wait', ms: 5000 },
        { type: 'wait', ms: 5000 },
      ],
    });
    expect(res.status, res.text).toBe(200);
    expect(res.json.cursor).toEqual({ x: 41, y: 51 });
  });

  it('refuses malformed batches and every cap with 400', async () => {
    const cases: Array<[string, unknown]> = [
      ['no actions', {}],
      ['unknown type', { actions: [{ type: 'teleport' }] }],
      ['unknown button', { actions: [{ type: 'button_press', button: 'fourth' }] }],
      ['unknown direction', { actions: [{ type: 'scroll', direction: 'inward' }] }],
      ['scroll amount 0', { actions: [{ type: 'scroll', direction: 'up', amount: 0 }] }],
      ['scroll amount 51', { actions: [{ type: 'scroll', direction: 'up', amount: 51 }] }],
      ['51 actions', { actions: Array.from({ length: 51 }, () => ({ type: 'mouse_move', x: 1, y: 1 })) }],
      ['empty text', { actions: [{ type: 'type', text: '' }] }],
      ['text over 8192 bytes', { actions: [{ type: 'type', text: 'é'.repeat(4097) }] }],
      ['text with NUL', { actions: [{ type: 'type', text: 'a\u0000b' }] }],
      ['over 32 KiB of text', { actions: Array.from({ length: 5 }, () => ({ type: 'type', text: 'a'.repeat(8000) })) }],
      ['delay over 500', { actions: [{ type: 'type', text: 'a', delay_ms: 501 }] }],
      ['wait 0', { actions: [{ type: 'wait', ms: 0 }] }],
      ['wait over 5000', { actions: [{ type: 'wait', ms: 5001 }] }],
      ['waits over 10 s', { actions: [{ type: 'wait', ms: 5000 }, { type: 'wait', ms: 5000 }, { type: 'wait', ms: 1 }] }],
      ['combo of 9 keys', { actions: [{ type: 'key', combo: 'a+b+c+d+e+f+g+h+i' }] }],
      ['combo with a space', { actions: [{ type: 'key', combo: 'ctrl+a b' }] }],
      ['a word that is no key', { actions: [{ type: 'key', combo: 'true' }] }],
      ['a keysym in the wrong case', { actions: [{ type: 'key', combo: 'ctrl+return' }] }],
      ['an unknown vendor key', { actions: [{ type: 'key', combo: 'XF86Bogus' }] }],
      ['click with x only', { actions: [{ type: 'click', x: 5 }] }],
      ['drag without to', { actions: [{ type: 'drag', from: { x: 1, y: 1 } }] }],
      ['drag with a partial from', { actions: [{ type: 'drag', from: { x: 1 }, to: { x: 2, y: 2 } }] }],
      ['negative coordinate', { actions: [{ type: 'mouse_move', x: -1, y: 0 }] }],
      ['fractional coordinate', { actions: [{ type: 'mouse_move', x: 1.5, y: 0 }] }],
    ];
    for (const [what, body] of cases) expectProblem(await call('POST', `/v1/desktops/${id}/input`, body), 400, what);
  });
});

describe('POST /v1/desktops/{id}/stream', () => {
  it('refuses an unknown claim with 400', async () => {
    for (const body of [{}, { claim: 'admin' }, { claim: 5 }]) {
      expectProblem(await call('POST', `/v1/desktops/${id}/stream`, body), 400, JSON.stringify(body));
    }
  });

  it("answers 201 with a single-use ticket URL at the host's stream gateway", async () => {
    const res = await call('POST', `/v1/desktops/${id}/stream`, { claim: 'view' });
    expect(res.status, res.text).toBe(201);
    expect(res.json.url).toMatch(/^tcp:\/\/127\.0\.0\.1:\d+\/\?ticket=stk_[A-Za-z0-9_-]{43}$/);
    expect(res.json.claim).toBe('view');
    expect(Math.abs(Date.parse(res.json.expires_at) - (Date.now() + 60_000))).toBeLessThan(5_000);
    const again = await call('POST', `/v1/desktops/${id}/stream`, { claim: 'view' });
    expect(again.json.url).not.toBe(res.json.url);
  });

  it('answers 409 once the desktop has as many view sessions as it may, counting granted tickets', async () => {
    let refused;
    for (let i = 0; i < 9 && refused === undefined; i++) {
      const res = await call('POST', `/v1/desktops/${id}/stream`, { claim: 'view' });
      if (res.status !== 201) refused = res;
    }
    expectProblem(refused!, 409, 'a ninth view session');
    expect(refused!.json.detail).toMatch(/at most 8 view sessions/);
  });
});

describe('every computer-use route', () => {
  const routes = (desktopId: string): Array<[string, string, unknown]> => [
    ['POST', `/v1/desktops/${desktopId}/screenshot`, {}],
    ['POST', `/v1/desktops/${desktopId}/input`, { actions: [] }],
    ['GET', `/v1/desktops/${desktopId}/display`, undefined],
    ['PUT', `/v1/desktops/${desktopId}/display`, { width: 800, height: 600 }],
    ['POST', `/v1/desktops/${desktopId}/stream`, { claim: 'view' }],
  ];

  it("answers 404 for another org's desktop, exactly as for a missing one", async () => {
    const other = api(s.url, await mintKey(s.databaseUrl, 'computer-use-other'));
    for (const [method, path, body] of routes(id)) {
      const theirs = await other(method, path, body);
      const missing = await call(method, path.replace(id, 'dsk_000000000000000000000000'), body);
      expectProblem(theirs, 404, path);
      expect(theirs.json).toEqual(missing.json);
    }
  });

  it('answers 409 while the desktop is not awake', async () => {
    const created = await call('POST', '/v1/desktops', { tier: 'small' });
    for (const [method, path, body] of routes(created.json.id)) expectProblem(await call(method, path, body), 409, path);
  });

  it('answers 501 on a host without computer-use support', async () => {
    const bare = await startFakeAgent(s.url, { computerUse: false });
    try {
      // The new host is empty, so placement puts the next desktop there.
      await agent.stop();
      const desktopId = await awakeDesktop(call);
      for (const [method, path, body] of routes(desktopId)) expectProblem(await call(method, path, body), 501, path);
    } finally {
      await bare.stop();
      agent = await startFakeAgent(s.url);
    }
  });
});
