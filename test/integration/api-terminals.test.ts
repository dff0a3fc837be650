/**
 * The terminal route's own rules, fast, with a real scheduler and a real agent on the FakeDriver
 * (which has no guest to put a terminal in: its tickets are granted, and the WebSocket closes with
 * 4503 `unavailable`): body validation, defaults, the per-desktop cap as 409, the not-awake 409,
 * another org's desktop answering exactly like a missing one, 401 without a key, 501 on a host
 * with no stream gateway, and `ws_url` beside the raw stream URL. The same route against the real
 * sandbox runtime is in test/e2e/terminals.test.ts.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WS_CLOSE } from '../../shared/src/terminal-protocol.js';
import { api, mintKey, startTestScheduler, type TestScheduler, awakeDesktop } from '../helpers/scheduler.js';
import { startFakeAgent, type TestAgent } from '../helpers/agent.js';
import { expectProblem } from '../helpers/problem.js';
import { openTerminal } from '../helpers/terminal.js';

let s: TestScheduler;
let agent: TestAgent;
let call: ReturnType<typeof api>;
let id: string;

beforeAll(async () => {
  s = await startTestScheduler();
  agent = await startFakeAgent(s.url);
  call = api(s.url, await mintKey(s.databaseUrl, 'terminals'));
  id = await awakeDesktop(call);
});

afterAll(async () => {
  await agent?.stop();
  await s?.close();
});

describe('POST /v1/desktops/{id}/terminals', () => {
  it('refuses malformed bodies with 400 before any guest work', async () => {
    for (const body of [{ cols: 1 }, { cols: 1001 }, { rows: 0 }, { rows: 80.5 }, { command: '' }, { command: 'a\u0000b' }, { tty: true }, [1]]) {
      expectProblem(await call('POST', `/v1/desktops/${id}/terminals`, body), 400, JSON.stringify(body));
    }
  });

  it('grants a single-use ws:// ticket with default size; the fake runtime closes it with 4503', async () => {
    const res = await call('POST', `/v1/desktops/${id}/terminals`);
    expect(res.status, res.text).toBe(201);
    expect(res.json).toMatchObject({ cols: 80, rows: 24 });
    expect(res.json.url).toMatch(/^ws:\/\/127\.0\.0\.1:\d+\/terminal\?ticket=ttk_[A-Za-z0-9_-]{43}$/);
    const term = await openTerminal(res.json.url);
    expect(await term.closed).toEqual({ exitCode: null, code: WS_CLOSE.unavailable, reason: 'unavailable' });
    const again = await openTerminal(res.json.url);
    expect((await again.closed).code).toBe(WS_CLOSE.invalid_ticket);
  });

  it('answers 409 over the per-desktop cap, counting unused tickets', async () => {
    const other = await awakeDesktop(call);
    for (let i = 0; i < 8; i++) expect((await call('POST', `/v1/desktops/${other}/terminals`, { command: 'true' })).status).toBe(201);
    expectProblem(await call('POST', `/v1/desktops/${other}/terminals`), 409, 'a ninth terminal');
    // The cap is per desktop.
    expect((await call('POST', `/v1/desktops/${id}/terminals`)).status).toBe(201);
    // Hibernating drops the unused tickets, so after a wake there is room again.
    expect((await call('POST', `/v1/desktops/${other}/hibernate?wait=true`)).json.state).toBe('succeeded');
    expectProblem(await call('POST', `/v1/desktops/${other}/terminals`), 409, 'a hibernated desktop');
    expect((await call('POST', `/v1/desktops/${other}/wake?wait=true`)).json.state).toBe('succeeded');
    expect((await call('POST', `/v1/desktops/${other}/terminals`)).status).toBe(201);
  });

  it("answers another org's desktop exactly like a missing one, and 401 without a key", async () => {
    const stranger = api(s.url, await mintKey(s.databaseUrl, 'terminals-other'));
    const foreign = await stranger('POST', `/v1/desktops/${id}/terminals`, {});
    const missing = await stranger('POST', '/v1/desktops/dsk_aaaaaaaaaaaaaaaaaaaaaaaa/terminals', {});
    expectProblem(foreign, 404);
    expect(foreign.text).toBe(missing.text);
    const anonymous = await fetch(`${s.url}/v1/desktops/${id}/terminals`, { method: 'POST' });
    expect(anonymous.status).toBe(401);
  });

  it('gives the stream ticket a ws_url for browsers beside the raw url', async () => {
    const res = await call('POST', `/v1/desktops/${id}/stream`, { claim: 'view' });
    expect(res.status, res.text).toBe(201);
    const raw = new URL(res.json.url);
    const ws = new URL(res.json.ws_url);
    expect([ws.protocol, ws.host, ws.pathname]).toEqual(['ws:', raw.host, '/vnc']);
    expect(ws.searchParams.get('ticket')).toBe(raw.searchParams.get('ticket'));
  });
});

describe('a host without a stream gateway', () => {
  it('answers 501 for terminals', async () => {
    const bare = await startTestScheduler();
    const noComputerUse = await startFakeAgent(bare.url, { computerUse: false });
    try {
      const c = api(bare.url, await mintKey(bare.databaseUrl, 'terminals-bare'));
      const desktop = await awakeDesktop(c);
      expectProblem(await c('POST', `/v1/desktops/${desktop}/terminals`), 501);
    } finally {
      await noComputerUse.stop();
      await bare.close();
    }
  });
});
