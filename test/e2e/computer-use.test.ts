/**
 * Computer use through the HTTP API (docs/api.md §4.5, 4.6) against a real awake sandbox desktop: the
 * real scheduler and a real agent in-process, Xvfb, xterm, xdotool and x11vnc in the guest, a
 * real PostgreSQL. A window opened in the guest shows in the screenshot, typed text changes its
 * pixels, the pointer lands exactly where it was sent, sizes are exact, a resize survives a
 * memory snapshot, and a real RFB client gets the display through a stream ticket (by way of the
 * `canto vnc` bridge, as an ordinary viewer would).
 */
import sharp from 'sharp';
import { createConnection, type RfbClient } from 'rfb2';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { startSandboxAgent, type SandboxAgent } from '../helpers/agent.js';
import { expectProblem } from '../helpers/problem.js';
import { bridgeOnce, dialStream, parseStreamUrl } from '../../cli/src/vnc-bridge.js';

const isRoot = process.getuid?.() === 0;

interface Raw {
  width: number;
  height: number;
  data: Buffer;
}

describe.skipIf(!isRoot)('computer use through the API, on a real sandbox desktop', () => {
  let scheduler: TestScheduler;
  let agent: SandboxAgent;
  let key: string;
  let call: ReturnType<typeof api>;
  let id: string;

  beforeAll(async () => {
    scheduler = await startTestScheduler();
    agent = await startSandboxAgent(scheduler.url);
    key = await mintKey(scheduler.databaseUrl, 'computer-use-e2e');
    call = api(scheduler.url, key);
    const created = await call('POST', '/v1/desktops', { tier: 'small' });
    id = created.json.id;
    const woke = await call('POST', `/v1/desktops/${id}/wake?wait=true`);
    expect(woke.json.state, woke.text).toBe('succeeded');
  }, 60_000);

  afterAll(async () => {
    await agent?.stop();
    await scheduler?.close();
  });

  async function png(body: Record<string, unknown> = {}): Promise<Buffer> {
    const res = await fetch(`${scheduler.url}/v1/desktops/${id}/screenshot`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('image/png');
    return Buffer.from(await res.arrayBuffer());
  }

  async function pixels(body: Record<string, unknown> = {}): Promise<Raw> {
    const { data, info } = await sharp(await png(body)).raw().toBuffer({ resolveWithObject: true });
    return { width: info.width, height: info.height, data };
  }

  /** Pixels that differ between two captures of the same size. */
  function changed(a: Raw, b: Raw): number {
    expect([a.width, a.height]).toEqual([b.width, b.height]);
    let n = 0;
    for (let i = 0; i < a.data.length; i += 3) {
      if (a.data[i] !== b.data[i] || a.data[i + 1] !== b.data[i + 1] || a.data[i + 2] !== b.data[i + 2]) n++;
    }
    return n;
  }

  const exec = (command: string) => call('POST', `/v1/desktops/${id}/exec`, { command });
  const input = (actions: unknown[]) => call('POST', `/v1/desktops/${id}/input`, { actions });

  it('shows a window opened in the guest, and text typed into it changes its pixels', async () => {
    const before = await pixels();
    expect([before.width, before.height]).toEqual([1024, 768]);
    const started = await call('POST', `/v1/desktops/${id}/exec`, {
      command: 'DISPLAY=:0 xterm -geometry 80x24+100+100 -bg white -fg black -title canto-e2e',
      detached: true,
    });
    expect(started.status, started.text).toBe(202);
    await until(async () => (await exec('DISPLAY=:0 xdotool search --onlyvisible --name canto-e2e')).json.exit_code === 0, 10_000, 'xterm to map');
    let withWindow = before;
    await until(async () => {
      withWindow = await pixels();
      return changed(before, withWindow) > 10_000;
    }, 10_000, 'the window in the screenshot');

    // Focus the terminal, then type: the glyphs change pixels inside the window only.
    const region = { x: 100, y: 100, width: 500, height: 300 };
    const moved = await input([{ type: 'click', x: 300, y: 250 }]);
    expect(moved.json.cursor).toEqual({ x: 300, y: 250 });
    const beforeTyping = await pixels({ region });
    const typed = await input([{ type: 'type', text: 'echo canto-was-here', delay_ms: 0 }, { type: 'key', combo: 'Return' }]);
    expect(typed.status, typed.text).toBe(200);
    let afterTyping = beforeTyping;
    await until(async () => {
      afterTyping = await pixels({ region });
      return changed(beforeTyping, afterTyping) > 200;
    }, 5_000, 'typed text on the screen');
  }, 60_000);

  it('moves the pointer to the exact point, clamped to the screen', async () => {
    const res = await input([{ type: 'mouse_move', x: 517, y: 333 }]);
    expect(res.json).toEqual({ cursor: { x: 517, y: 333 } });
    const seen = await exec('DISPLAY=:0 xdotool getmouselocation --shell');
    expect(seen.json.stdout).toContain('X=517\nY=333\n');
    expect((await input([{ type: 'mouse_move', x: 5000, y: 5000 }])).json).toEqual({ cursor: { x: 1023, y: 767 } });
    expect((await input([])).json).toEqual({ cursor: { x: 1023, y: 767 } });
  });

  it('gives exact sizes for regions and scales, in both encodings', async () => {
    const cropped = await pixels({ region: { x: 10, y: 20, width: 300, height: 200 } });
    expect([cropped.width, cropped.height]).toEqual([300, 200]);
    const scaled = await pixels({ region: { x: 0, y: 0, width: 1000, height: 500 }, scale_percent: 25 });
    expect([scaled.width, scaled.height]).toEqual([250, 125]);
    const clamped = await pixels({ region: { x: 1000, y: 700, width: 200, height: 200 } });
    expect([clamped.width, clamped.height]).toEqual([24, 68]);
    const b64 = await call('POST', `/v1/desktops/${id}/screenshot`, { encoding: 'base64', scale_percent: 50 });
    expect([b64.json.width, b64.json.height]).toEqual([512, 384]);
    const meta = await sharp(Buffer.from(b64.json.data_base64, 'base64')).metadata();
    expect([meta.format, meta.width, meta.height]).toEqual(['png', 512, 384]);
    expectProblem(await call('POST', `/v1/desktops/${id}/screenshot`, { region: { x: 0, y: 0, width: 10 } }), 400);
  });

  it('keeps a resized display across hibernate and wake', async () => {
    const resized = await call('PUT', `/v1/desktops/${id}/display`, { width: 1280, height: 800 });
    expect(resized.json).toEqual({ width: 1280, height: 800 });
    const full = await pixels();
    expect([full.width, full.height]).toEqual([1280, 800]);
    expect((await call('POST', `/v1/desktops/${id}/hibernate?wait=true`)).json.state).toBe('succeeded');
    expectProblem(await call('POST', `/v1/desktops/${id}/screenshot`, {}), 409);
    expectProblem(await call('POST', `/v1/desktops/${id}/input`, { actions: [] }), 409);
    expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).json.state).toBe('succeeded');
    expect((await call('GET', `/v1/desktops/${id}/display`)).json).toEqual({ width: 1280, height: 800 });
    const after = await pixels();
    expect([after.width, after.height]).toEqual([1280, 800]);
    await call('PUT', `/v1/desktops/${id}/display`, { width: 1024, height: 768 });
  }, 60_000);

  /** An RFB client (rfb2) reaching the stream through a `canto vnc` bridge on a local port. */
  async function viewer(url: string): Promise<{ rfb: RfbClient; bridged: Promise<void> }> {
    let bridged: Promise<void> = Promise.resolve();
    const port = await new Promise<number>((resolve, reject) => {
      bridged = bridgeOnce(parseStreamUrl(url), { listenHost: '127.0.0.1', listenPort: 0, onListening: resolve });
      bridged.catch(reject);
    });
    const rfb = createConnection({ host: '127.0.0.1', port });
    await new Promise<void>((resolve, reject) => {
      rfb.once('connect', resolve);
      rfb.once('error', reject);
    });
    return { rfb, bridged };
  }

  const stream = (claim: string) => call('POST', `/v1/desktops/${id}/stream`, { claim });

  it('streams the display to a VNC client through a single-use ticket', async () => {
    const granted = await stream('view');
    expect(granted.status, granted.text).toBe(201);
    expect(granted.json.claim).toBe('view');
    expect(granted.json.url).toMatch(/^tcp:\/\/127\.0\.0\.1:\d+\/\?ticket=stk_[A-Za-z0-9_-]+$/);
    const ttl = Date.parse(granted.json.expires_at) - Date.now();
    expect(ttl).toBeGreaterThan(30_000);
    expect(ttl).toBeLessThanOrEqual(60_000);

    const { rfb, bridged } = await viewer(granted.json.url);
    expect([rfb.width, rfb.height]).toEqual([1024, 768]);
    let area = 0;
    await new Promise<void>((resolve) => {
      rfb.on('rect', (rect) => {
        area += rect.width * rect.height;
        if (area >= 1024 * 768) resolve();
      });
      rfb.requestUpdate(false, 0, 0, rfb.width, rfb.height);
    });
    // The ticket worked once; presenting it again is refused.
    await expect(dialStream(parseStreamUrl(granted.json.url))).rejects.toThrow(/invalid_ticket/);
    rfb.end();
    await bridged;
  }, 30_000);

  it('holds a control claim: exec and files answer 409 until its connection closes, input keeps working', async () => {
    const control = await stream('control');
    expect(control.status, control.text).toBe(201);
    // Held from the grant, before anyone dials.
    expectProblem(await exec('true'), 409, 'exec under a control claim');
    expectProblem(await call('GET', `/v1/desktops/${id}/files-meta/root`), 409, 'stat under a control claim');
    expectProblem(await stream('control'), 409, 'a second control claim');
    expect((await stream('view')).status).toBe(201);
    expect((await input([{ type: 'mouse_move', x: 10, y: 10 }])).json).toEqual({ cursor: { x: 10, y: 10 } });
    expect((await call('POST', `/v1/desktops/${id}/screenshot`, { encoding: 'base64', scale_percent: 10 })).status).toBe(200);

    const { rfb, bridged } = await viewer(control.json.url);
    expectProblem(await exec('true'), 409, 'exec while the controller is connected');
    rfb.end();
    await bridged;
    await until(async () => (await exec('true')).status === 200, 5_000, 'the claim to be released');
    expect((await stream('control')).status).toBe(201); // and a new one can be had (it expires unused)
  }, 30_000);

  it('closes streams when the desktop hibernates', async () => {
    const granted = await stream('view');
    const { rfb, bridged } = await viewer(granted.json.url);
    expect((await call('POST', `/v1/desktops/${id}/hibernate?wait=true`)).json.state).toBe('succeeded');
    await bridged; // the gateway hung up, so the bridge's one connection ended
    rfb.end();
    expectProblem(await stream('view'), 409);
    expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).json.state).toBe('succeeded');
    // The hibernate released the unused control claim of the previous test along with the rest.
    expect((await exec('true')).status).toBe(200);
  }, 60_000);
});
