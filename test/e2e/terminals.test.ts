/**
 * Terminals and the browser form of the screen stream through the HTTP API, against a real awake
 * sandbox desktop: the real scheduler and a real agent in-process, a real PostgreSQL, `ws` as the
 * client. A terminal opened through `POST /v1/desktops/{id}/terminals` runs a shell inside the
 * desktop (output, resize, exit status, single-use ticket); another org sees 404, no key 401, a
 * hibernated desktop 409 (and hibernating closes an open terminal); the stream ticket answer
 * carries a `ws_url` speaking RFB for view and control claims, once. `canto terminal` (the built
 * CLI, run `npx tsup` first) attaches piped input to a terminal and exits with its status.
 */
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WS_CLOSE } from '../../shared/src/terminal-protocol.js';
import { api, mintKey, startTestScheduler, until, type TestScheduler } from '../helpers/scheduler.js';
import { startSandboxAgent, type SandboxAgent } from '../helpers/agent.js';
import { expectProblem } from '../helpers/problem.js';
import { hostProcesses } from '../helpers/sandbox.js';
import { openTerminal, rfbOverWebSocket } from '../helpers/terminal.js';

const isRoot = process.getuid?.() === 0;
const CLI = join(import.meta.dirname, '..', '..', 'dist', 'cli.js');

describe.skipIf(!isRoot)('terminals and the WebSocket stream through the API, on a real sandbox desktop', () => {
  let scheduler: TestScheduler;
  let agent: SandboxAgent;
  let call: ReturnType<typeof api>;
  let stranger: ReturnType<typeof api>;
  let id: string;

  beforeAll(async () => {
    scheduler = await startTestScheduler();
    agent = await startSandboxAgent(scheduler.url);
    call = api(scheduler.url, await mintKey(scheduler.databaseUrl, 'terminals-e2e'));
    stranger = api(scheduler.url, await mintKey(scheduler.databaseUrl, 'terminals-e2e-other'));
    const created = await call('POST', '/v1/desktops', { tier: 'small' });
    id = created.json.id;
    const woke = await call('POST', `/v1/desktops/${id}/wake?wait=true`);
    expect(woke.json.state, woke.text).toBe('succeeded');
  }, 60_000);

  afterAll(async () => {
    await agent?.stop();
    await scheduler?.close();
  });

  const terminal = (body: unknown = {}) => call('POST', `/v1/desktops/${id}/terminals`, body);

  it('opens a terminal in the desktop: output, resize, exit status, and the ticket works once', async () => {
    const granted = await terminal({ cols: 100, rows: 30 });
    expect(granted.status, granted.text).toBe(201);
    expect(granted.json).toMatchObject({ cols: 100, rows: 30 });
    expect(granted.json.url).toMatch(/^ws:\/\/127\.0\.0\.1:\d+\/terminal\?ticket=ttk_[A-Za-z0-9_-]{43}$/);
    expect(Date.parse(granted.json.expires_at) - Date.now()).toBeGreaterThan(30_000);

    const term = await openTerminal(granted.json.url);
    const n = Math.floor(Math.random() * 1e9);
    term.type(`echo hello-$((${n} * 2)); stty size\n`);
    await term.waitFor(new RegExp(`hello-${n * 2}\\r\\n30 100\\r\\n`));
    const mark = term.output().length;
    term.resize(120, 40);
    term.type('stty size\n');
    await term.waitFor(/\b40 120\r\n/, 10_000, mark);
    term.type('exit 3\n');
    expect(await term.closed).toEqual({ exitCode: 3, code: WS_CLOSE.done, reason: 'done' });

    const again = await openTerminal(granted.json.url);
    expect((await again.closed).code).toBe(WS_CLOSE.invalid_ticket);
  }, 30_000);

  it('attaches `canto terminal` to it, exiting with the status of what ran in the desktop', async () => {
    const url = (await terminal({ cols: 90, rows: 25 })).json.url as string;
    const child = spawn(process.execPath, [CLI, 'terminal', url], { stdio: ['pipe', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (chunk: Buffer) => (out += chunk.toString('utf8')));
    const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
    child.stdin.end('echo from-cli-$((20 + 1)); stty size; exit 4\n');
    expect(await exited).toBe(4);
    expect(out).toMatch(/from-cli-21\r\n25 90\r\n/);

    // The url may come from the environment instead, out of other users' sight (argv is public).
    const hidden = (await terminal()).json.url as string;
    const quiet = spawn(process.execPath, [CLI, 'terminal'], { stdio: ['pipe', 'pipe', 'pipe'], env: { ...process.env, CANTO_TERMINAL_URL: hidden } });
    const quietExited = new Promise<number | null>((resolve) => quiet.once('exit', (code) => resolve(code)));
    quiet.stdin.end('exit 5\n');
    expect(await quietExited).toBe(5);
  }, 30_000);

  it('validates the body and answers 401 without a key and 404 for another org', async () => {
    expectProblem(await terminal({ cols: 0 }), 400, 'cols 0');
    expectProblem(await terminal({ rows: 501 }), 400, 'rows 501');
    expectProblem(await terminal({ shell: 'bash' }), 400, 'an unknown member');
    const anonymous = await fetch(`${scheduler.url}/v1/desktops/${id}/terminals`, { method: 'POST' });
    expect(anonymous.status).toBe(401);
    const foreign = await stranger('POST', `/v1/desktops/${id}/terminals`, {});
    const missing = await stranger('POST', '/v1/desktops/dsk_aaaaaaaaaaaaaaaaaaaaaaaa/terminals', {});
    expectProblem(foreign, 404, 'another org');
    expect(foreign.text).toBe(missing.text);
  });

  it('gives a ws_url beside the raw stream url, speaking RFB for view and control, once', async () => {
    for (const claim of ['view', 'control'] as const) {
      const granted = await call('POST', `/v1/desktops/${id}/stream`, { claim });
      expect(granted.status, granted.text).toBe(201);
      expect(granted.json.url).toMatch(/^tcp:\/\//);
      expect(granted.json.ws_url).toMatch(/^ws:\/\/127\.0\.0\.1:\d+\/vnc\?ticket=stk_/);
      expect(new URL(granted.json.ws_url).searchParams.get('ticket')).toBe(new URL(granted.json.url).searchParams.get('ticket'));
      const viewer = await rfbOverWebSocket(granted.json.ws_url);
      expect([viewer.rfb.width, viewer.rfb.height]).toEqual([1024, 768]);
      const frame = new Promise<void>((resolve) => viewer.rfb.once('rect', () => resolve()));
      viewer.rfb.requestUpdate(false, 0, 0, 1024, 768);
      await frame;
      await expect(rfbOverWebSocket(granted.json.ws_url)).rejects.toThrow(/4401 invalid_ticket/);
      viewer.ws.close();
    }
    // The control claim ends with its connection.
    await until(async () => (await call('POST', `/v1/desktops/${id}/exec`, { command: 'true' })).status === 200, 5_000, 'the claim to be released');
  }, 30_000);

  it('closes an open terminal when the desktop hibernates, then answers 409 until it wakes', async () => {
    const term = await openTerminal((await terminal({ command: 'sleep 4711' })).json.url);
    // And one through `canto terminal`, which says why it ended.
    const cli = spawn(process.execPath, [CLI, 'terminal', (await terminal({ command: 'sleep 4712' })).json.url], { stdio: ['pipe', 'pipe', 'pipe'] });
    let said = '';
    cli.stderr.on('data', (chunk: Buffer) => (said += chunk.toString('utf8')));
    const cliExited = new Promise<number | null>((resolve) => cli.once('exit', (code) => resolve(code)));
    await until(async () => (await hostProcesses((args) => args.includes('4711') || args.includes('4712'))).length >= 2, 10_000, 'the terminals to start');
    expect((await call('POST', `/v1/desktops/${id}/hibernate?wait=true`)).json.state).toBe('succeeded');
    expect((await term.closed).code).toBe(WS_CLOSE.going_away);
    expect(await cliExited).toBe(1);
    expect(said).toContain('The terminal ended: the desktop stopped (hibernated, moved to another host or destroyed)');
    expect(await hostProcesses((args) => args.includes('4711'))).toEqual([]);
    expectProblem(await terminal(), 409, 'a hibernated desktop');
    expect((await call('POST', `/v1/desktops/${id}/wake?wait=true`)).json.state).toBe('succeeded');
    expect((await terminal()).status).toBe(201);
  }, 60_000);
});
